"""One chat request to Corral with the openai package (the venv `make serve` built has it):

    .venv/bin/python examples/first_request.py

It talks to $CORRAL_URL, or to where `make serve` listens by default.
"""

import os

from openai import OpenAI

url = os.environ.get("CORRAL_URL", "http://127.0.0.1:8080")
client = OpenAI(base_url=f"{url}/v1", api_key="unused")  # any key while none is configured
reply = client.chat.completions.create(
    model="gemma",  # a model name from the config, or one of its aliases
    messages=[{"role": "user", "content": "Write a haiku about llamas."}],
    max_tokens=64,
)
print(reply.choices[0].message.content)
