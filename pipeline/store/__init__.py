"""The embedding store: committed per-shard vectors, the output transform applied as they enter, change detection."""
