"""The `corral` command line: serving (the composition root that joins the HTTP router and
the supervisor), editing the config file, steering a running server, and chatting in the
terminal. Nothing in router/, supervisor/ or worker/ imports it."""
