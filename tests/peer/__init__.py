"""Peer harness: llama.cpp's own server test suite, run against llama-server and Corral."""
