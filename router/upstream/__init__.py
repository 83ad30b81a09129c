"""Models served elsewhere: which replica takes a request, and whether each is in rotation."""
