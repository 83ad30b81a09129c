"""`corral chat`: the terminal loop (terminal.py), the conversation it keeps (session.py),
and its two backends, a running server (over_http.py) or a model loaded in this process
(in_process.py)."""
