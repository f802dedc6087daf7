"""The oasis daemon and its command-line tools."""

import os

# gRPC's core logs its own lines on stderr (``E1127 ... add_port.cc:83] Failed to add
# port``) beside the one-line errors oasis prints for the same failure; it reads this
# before grpc is first imported, so here. GRPC_VERBOSITY=debug (or info, error) in the
# environment still turns them on.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
