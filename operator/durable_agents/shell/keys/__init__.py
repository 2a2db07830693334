"""The keys room.

The sealing keyring read at start-up (keyring), the rotation pass that reseals runs under the active
key (resealer), and the guard refusing to retire a key runs still use (keyguard).
"""
