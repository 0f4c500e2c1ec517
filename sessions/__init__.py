"""The SQLite session store: runs, events, blobs."""
