"""Generated gRPC code (``python proto/generate.py``); not committed."""
