"""Images (and audio) in a prompt: decoding untrusted bytes into pixels (`pictures`), the
projector that turns them into embeddings (`projector`, libmtmd), the thread that encodes
them beside the engine loop (`encoder`), and how an image stands in a request's tokens
(`spans`) and is decoded into its sequence (`steps`)."""
