"""``petal serve``: an HTTP service that embeds and searches a live index (the optional ``serve`` extra)."""
