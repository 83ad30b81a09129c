"""Requests in a dialect an upstream does not speak, sent to it in OpenAI's.

A model served by an OpenAI-compatible upstream (llama-server, vLLM, a hosted API, another
Corral) is reached from Corral's Anthropic, Responses and Ollama routes too. The route
decodes and checks its body into the internal request (router/generation/job.py) as for a
local model; `outbound` writes that as a chat completion request, and `inbound` reads the
upstream's stream of chunks back into the internal events (router/generation/events.py),
which the route's own renderer turns into its dialect; `run` sends it through the relay.
"""
