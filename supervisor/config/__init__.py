"""Configuration: reading and checking the TOML file, editing it in place, finding it, the
models of a models_dir, GGUF headers, and API keys. Nothing here runs a process.

  schema.py      the file's tables (msgspec Structs) and the Config the supervisor runs on
  reading.py     text -> Config: parse, convert key by key, check, gather keys
  convert.py     one table checked key by key, every problem in English
  checks.py      what the types cannot say: ranges, paths, origins, hosts, sizes
  keys.py        API and admin keys from the file, a keys file and CORRAL_API_KEYS
  models_dir.py  a folder's *.gguf files as model tables
  gguf_meta.py   a GGUF file's header: is it a model, what it needs
  templates.py   llama.cpp's built-in chat template names
  search.py      which file a command reads when --config is not given
  key_paths.py   `models."qwen2.5".slots`: key paths, typed values
  edit.py        edits of the text that keep the rest byte for byte (tomlkit)
  rewrite.py     an edit checked as serve checks a file, written atomically
  show.py        the effective config, keys masked
  atomic_write.py  a file replaced so a reader sees old or new bytes, never a mix

The names most callers need are here: `from supervisor.config import Config, load`.
"""

from supervisor.config.reading import from_bytes, load, parse, read_bytes, with_server, without_file
from supervisor.config.schema import (
    Config,
    ConfigError,
    ConfigFile,
    ModelConfig,
    ModelSpec,
    ServerConfig,
    SupervisorConfig,
    listen_hosts,
)

__all__ = [
    "Config",
    "ConfigError",
    "ConfigFile",
    "ModelConfig",
    "ModelSpec",
    "ServerConfig",
    "SupervisorConfig",
    "from_bytes",
    "listen_hosts",
    "load",
    "parse",
    "read_bytes",
    "with_server",
    "without_file",
]
