"""The oasis daemon and its command-line tools."""
