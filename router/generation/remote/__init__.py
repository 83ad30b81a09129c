"""Requests in a dialect an upstream does not speak, sent to it in OpenAI's or Anthropic's.

A model served by an OpenAI-compatible upstream (llama-server, vLLM, a hosted API, another
Corral) is reached from Corral's Anthropic, Responses and Ollama routes too; one served
by an upstream that speaks only Anthropic's Messages API, from the OpenAI, Responses and
Ollama chat routes. The route decodes and checks its body into the internal request
(router/generation/job.py) as for a local model; `outbound` (or `anthropic_request`)
writes that as the upstream's request, and `inbound` (or `anthropic_events`) reads its
stream back into the internal events (router/generation/events.py), which the route's own
renderer turns into its dialect; `run` sends it through the relay.
"""
