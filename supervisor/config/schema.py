"""The config file's schema, and the config the supervisor runs on.

`ConfigFile` and its tables are msgspec Structs that reject unknown keys: what the TOML may
say. `Config` and `ModelSpec` are what reading it gives (supervisor/config/reading.py):
paths resolved, defaults applied, keys gathered. A model's worker options are declared once,
in worker.protocol.ModelOptions, which `ModelConfig` and `ModelSpec` inherit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from supervisor.config.convert import Seconds
from supervisor.config.keys import ApiKeyTable, Keyring
from supervisor.config.lora_views import LoraView
from worker.protocol import ModelOptions, SamplingParams


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    # The address to listen on, or several (llama-server's --host 127.0.0.1,::1), all on
    # `port`.
    host: str | list[str] = "127.0.0.1"
    port: int = 8080
    # Upper bound on a request body; OpenAI payloads with long chats stay far below it.
    max_body_bytes: int = 16 * 1024 * 1024
    # On SIGTERM/SIGINT, how long requests in flight may take to finish before being cut.
    drain_timeout: Seconds = 30.0
    # Where a request that names no model goes (a name or an alias). Without it, a request
    # must name its model. Applies on reload, unlike the keys above.
    default_model: str | None = None
    # A request that names a model Corral does not serve: "error" answers 404 naming it;
    # "default" serves it with the default model (default_model, or the only model), as
    # llama-server serving one model ignores the name a client sends.
    unknown_model: Literal["error", "default"] = "error"
    # Keys (supervisor/config/keys.py). With any API key, every route but /health needs a key.
    # /admin/* and /metrics need an admin key; with no key configured at all, they answer
    # loopback clients only, and with API keys but no admin key, no one. All three apply on
    # reload, and a reload re-reads the file.
    api_keys: list[str | ApiKeyTable] = []
    api_keys_file: str | None = None
    admin_keys: list[str] = []
    # GET /metrics without a key, from any client: for scrapers that send none, such as the
    # Kubernetes Gateway API Inference Extension's endpoint picker (deploy/k8s/). It shows
    # model names, their load and their last errors. Applies on reload.
    public_metrics: bool = False
    # With keys configured, the longest an API key's Ollama keep_alive may keep a model
    # loaded once idle, in seconds; None: the model's own idle_timeout; 0: no bound. Nor
    # is it ever shorter than the idle_timeout: unloading is an admin key's
    # (router/server/steering.py). Applies on reload.
    max_keep_alive: Seconds | None = None
    # Serving on an address other than loopback with no API key is refused unless this is
    # set: anyone who can reach the port could use the models and reload the config.
    allow_insecure_bind: bool = False
    # HTTPS: a PEM certificate (chain) and its private key, both or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    # Origins a browser page may call Corral from ("https://app.example", or "*"); none by
    # default: a request from any other page is refused (router/server/site_guard.py). Applies on
    # reload.
    cors_origins: list[str] = []
    # Names (or addresses) by which clients may reach the server while no API key is
    # configured, besides loopback names and the address it listens on: a reverse proxy's
    # public name. ".example.com" admits every name under it; "*" turns the check off.
    # Guards against DNS rebinding (router/server/site_guard.py). Applies on reload.
    allowed_hosts: list[str] = []
    # Hosts whose image URLs Corral fetches for clients (router/generation/image_urls.py):
    # names, or ".example.com" for every name under it. None by default: a server that
    # fetches any URL it is sent reaches what only it can reach (SSRF).
    image_url_hosts: list[str] = []
    # "text" or "json" (one object a line) for the server's and its workers' logs, the
    # access log included.
    log_format: Literal["text", "json"] = "text"
    # GET /slots, what each slot of a model is doing (llama-server's --slots / --no-slots).
    # Off, it answers 501.
    slots_endpoint: bool = True
    # A folder for llama-server's slot files (its --slot-save-path): POST /slots/{id}
    # ?action=save|restore with {"filename"} writes and reads a slot's cache there. Unset,
    # those actions answer 501. Relative to the config file. Applies on reload.
    slot_save_path: str | None = None
    # What the folder's files may take in all: a save past it answers 507 and writes
    # nothing (about 18 KB a token of the demo model, far more for larger ones). 0: no bound.
    slot_save_max_bytes: int = 4 * 1024**3
    # Who may save, restore and erase slots once keys are configured (with none, anyone
    # may, as with llama-server): "admin", admin keys only; "keys", any key that may use the
    # model, each in a folder of its own under slot_save_path and only on slots holding its
    # own cache. Applies on reload.
    slot_actions: Literal["admin", "keys"] = "admin"
    # Tools that run at the API's provider (Responses' web_search, file_search, ...;
    # Anthropic's server tools), which agent CLIs send by default: "skip" leaves them out
    # and serves the rest, said in the log once per type and in each answer's
    # x-corral-skipped-tools header (llama-server skips them too); "refuse" answers 400
    # naming the tool. Applies on reload.
    hosted_tools: Literal["skip", "refuse"] = "skip"
    # A request for a model that is not loaded loads it (llama-server's --models-autoload).
    # Off (its --no-models-autoload): such a request is a 400 "model is not loaded" unless
    # it asks `?autoload=true`; models load by POST /models/load or the admin API, and one
    # asleep (unloaded by its idle_timeout) still wakes for a request.
    models_autoload: bool = True
    # The shape of errors on the OpenAI routes: OpenAI's ({"error": {"message", "type",
    # "param", "code"}}), or llama-server's, which answers them in its own shape
    # ({"error": {"code", "message", "type"}}, a context overflow as
    # exceed_context_size_error with n_prompt_tokens and n_ctx).
    v1_error_shape: Literal["openai", "llama-server"] = "openai"
    # Every chat answer (not streamed) carries `__verbose` with the prompt as rendered, as
    # llama-server's with --verbose; a request's own `verbose` wins. For debugging templates.
    verbose_responses: bool = False
    # A folder whose *.gguf files are served under their file stems, with no table each
    # (supervisor/config/models_dir.py); a [models.NAME] table of the same name overrides one.
    # Rescanned at every reload; relative to the config file.
    models_dir: str | None = None
    # Where `corral serve` writes its pid at start (atomically) and removes it at exit, so
    # that `corral config ... --reload --signal` can send it SIGHUP. Relative to the file.
    pid_file: str | None = None
    # OpenAI's Responses API keeps each response made with `store` (its default) in memory,
    # so that a later request can continue it by `previous_response_id` and GET /v1/responses/ID
    # can read it: for this long after it was made, and at most this many bytes of them in
    # all (the oldest go first). 0 keeps none. Applies on reload; a restart forgets them.
    responses_ttl: Seconds = 3600.0
    responses_max_bytes: int = 64 * 1024 * 1024
    # Other Corral servers this one shows beside its own (GET /admin/fleet, the dashboard's
    # fleet, `corral status --fleet`): their root URLs ("http://10.0.0.2:8080"), asked for
    # their /admin/models with the admin key in fleet_key_env or fleet_key_file (one key for
    # all, as `corral status --url A --url B` sends one). Applies on reload.
    fleet: list[str] = []
    fleet_key_env: str | None = None
    fleet_key_file: str | None = None
    # A folder for what must outlive a restart: the usage ledger (usage.sqlite3: requests and
    # tokens by key, model and hour; router/usage/), which GET /admin/usage and `corral usage`
    # read and keys' tokens_per_day count from. Made if missing; relative to the config file.
    # Unset: the ledger is kept in memory and a restart forgets it. Read at start only.
    state_dir: str | None = None
    # The ledger keeps hours for this long, then one row a UTC day; days for usage_daily_for
    # (0: for ever).
    usage_hourly_for: Seconds = 14 * 86400.0
    usage_daily_for: Seconds = 400 * 86400.0


class SupervisorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    idle_timeout: Seconds = 600.0  # seconds; 0 = never unload
    start_timeout: Seconds = 120.0  # seconds from spawn to Ready
    stop_grace: Seconds = 5.0  # seconds between SIGTERM and SIGKILL
    # A ping over the worker socket every health_interval seconds (0 disables). A worker
    # that has not answered for health_misses intervals is hung: it is killed and replaced.
    health_interval: Seconds = 10.0
    health_misses: int = 3
    # A worker that fails to load, or dies within min_uptime seconds of Ready, is a failed
    # start: retried after backoff_base * 2^(n-1) seconds (capped at backoff_max), and after
    # start_retries failures in a row the model is failed until a reset or reload.
    min_uptime: Seconds = 5.0
    start_retries: int = 3
    backoff_base: Seconds = 1.0
    backoff_max: Seconds = 60.0
    # Capacity. A model that does not fit evicts the least recently used idle, unpinned
    # models; if none can go, its requests queue (first come, first served) for up to
    # load_wait seconds, then get 503 with Retry-After. load_wait also bounds a request's
    # wait through a backoff. A model's cost is its GGUF size plus its KV cache until it
    # has loaded, then its worker's resident memory.
    max_loaded_models: int = 0  # 0: no limit
    memory_budget: int | str = 0  # bytes, or "12GiB", "8GB", ...; 0: no limit
    # GPU memory the loaded models may hold: one size for all GPUs together, or a table
    # of sizes by device name as llama.cpp names them ({ CUDA0 = "22GiB", CUDA1 = "22GiB" }).
    # A model's share is estimated from its GGUF's layers and its load options until its
    # worker reports what llama.cpp allocated (supervisor/gpu_memory.py). 0: no limit.
    gpu_memory_budget: int | str | dict[str, int | str] = 0
    # Host memory for every loaded model's saved prompts together (each model's own bound is
    # its prompt_cache_bytes): shared among the models loaded together, re-divided as they
    # load and unload (supervisor/cache_shares.py). Bytes or "4GiB"; 0: no global bound.
    prompt_cache_budget: int | str = 0
    load_wait: Seconds = 60.0
    # A reload (SIGHUP, POST /admin/reload) applies the file once it has stayed the same
    # for this long, so a file caught mid-write is never applied half-written.
    reload_settle: Seconds = 0.5


class GenerationDefaults(ModelOptions, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A model's generation defaults, as llama-server's command line sets them (--temp,
    --seed, --n-predict, ...): a request that sets one of these itself wins. Unset: the
    worker protocol's (llama-server's) defaults. The router's alone: a reload that changes
    them takes effect without restarting the worker. Inherited by the config's table and
    the resolved spec, so that each is declared once."""

    # The token limit of a request that sets none (max_tokens, max_completion_tokens or
    # n_predict). None: the chat runs until the model stops or the context is full, and
    # a legacy completion stops at 16, as OpenAI's does. `n_predict` is llama-server's
    # name for it (-1: no limit); set one of the two.
    max_tokens: int | None = None
    n_predict: int | None = None
    # The most tokens one request may generate, whatever it asks (llama-server's -n caps
    # n_predict so): a request asking more, or no limit, is cut to it and ends with
    # "length". None: no cap. A key's own max_tokens cuts further.
    max_tokens_limit: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None  # the tokens repeat_penalty looks back over (-1: all)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None  # -1: a random seed each request
    stop: list[str] | None = None

    @property
    def defaults(self) -> SamplingParams:
        """What a request that sets nothing gets: these over the protocol's defaults."""
        given = {f: getattr(self, f) for f in _SAMPLING_KEYS if getattr(self, f) is not None}
        if given.get("seed") == -1:
            del given["seed"]
        max_tokens = self.max_tokens
        if max_tokens is None and self.n_predict is not None and self.n_predict >= 0:
            max_tokens = self.n_predict
        return SamplingParams(max_tokens=max_tokens, **given)


# GenerationDefaults' keys that SamplingParams has under the same name.
_SAMPLING_KEYS = (
    "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty", "seed", "stop",
)


class ModelConfig(GenerationDefaults, forbid_unknown_fields=True, frozen=True):
    """A `[models.NAME]` table: the worker's options and the generation defaults
    (inherited), and the supervisor's own."""

    # The GGUF file, or none for a model served elsewhere (`upstream`) or an adapter model.
    path: str | None = None
    # An adapter model (supervisor/config/lora.py): another model's name, whose worker
    # serves this name with this table's `lora` adapters applied.
    base: str | None = None
    aliases: list[str] = []
    tags: list[str] = []  # shown in /v1/models, as llama-server's --tags
    idle_timeout: Seconds | None = None  # overrides [supervisor] idle_timeout
    preload: bool = False  # load at start instead of on the first request
    pinned: bool = False  # never unloaded for idleness
    instances: int = 1  # worker processes of this model, served as one name (supervisor/group.py)
    # Requests waiting for a slot (supervisor/slot_queue.py): beyond max_queue a request
    # gets 429 at once (None: no bound); after queue_timeout seconds in line, 503 (0: no
    # limit).
    max_queue: int | None = None
    queue_timeout: Seconds = 0.0
    # A model served elsewhere (router/upstream/): the base URL of an OpenAI-compatible
    # server ("http://host:8080/v1"), or a list of replicas. With `path` too, the model's own
    # worker is one more replica. The router's alone (supervisor/config/upstreams.py).
    upstream: str | list[str] | None = None
    upstream_model: str | None = None  # its name there; default: this table's name
    # The key to send there (as `Authorization: Bearer`): an environment variable's name, or
    # a file holding it. Read at start and at each reload.
    api_key_env: str | None = None
    api_key_file: str | None = None
    # Seconds an upstream may stay silent: connecting, before its answer starts, between
    # two chunks of a stream. Past it, the request fails over (before the first byte) or ends.
    timeout: Seconds = 600.0
    max_concurrency: int | None = None  # requests in flight per replica; beyond it, another replica or 503
    # The API dialects the upstream speaks: a request in one of them is relayed as it came.
    # Another Corral speaks all five ("openai", "anthropic", "responses", "ollama", "llama").
    upstream_dialects: list[str] = msgspec.field(default_factory=lambda: ["openai"])
    # The upstream takes vLLM's `cache_salt` (another Corral, vLLM): each request sent there
    # carries its key's cache scope as one, so that the upstream's prefix cache is kept
    # apart per key as this server's is (router/server/cache_scope.py). Off, the upstream's
    # cache is shared by every key that may use the model.
    upstream_cache_salt: bool = False


# The keys of a [models.NAME] table that describe an upstream; the router acts on them.
UPSTREAM_KEYS = (
    "upstream", "upstream_model", "api_key_env", "api_key_file", "timeout", "max_concurrency", "upstream_dialects",
    "upstream_cache_salt",
)


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    server: ServerConfig = ServerConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    models: dict[str, ModelConfig] = {}


class ConfigError(Exception):
    """One or more problems in a config file, each as `key.path: message`."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        # Problems end up in one-line places (the log, systemd's STATUS=, a JSON field);
        # a key such as [models."a\nb"] must not break them.
        self.problems = [_one_line(p) for p in problems]
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(where + "; ".join(self.problems))


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ModelSpec(GenerationDefaults, frozen=True):
    """A model as the supervisor runs it: config with paths resolved and defaults applied.

    A Struct like the config it comes from, so that it inherits the worker's options
    rather than repeating them; a reload compares two of them whole.
    """

    name: str
    path: Path
    aliases: tuple[str, ...]
    idle_timeout: float
    tags: tuple[str, ...] = ()
    preload: bool = False
    pinned: bool = False
    instances: int = 1
    max_queue: int | None = None
    queue_timeout: float = 0.0


@dataclass(frozen=True)
class UpstreamSpec:
    """A model served elsewhere, as the router relays to it (router/upstream/)."""

    name: str
    urls: tuple[str, ...]  # each replica's base URL, without a trailing slash
    model: str  # the name it has there
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None  # where the key was read from, as the file says
    api_key_file: str | None = None
    timeout: float = 600.0
    max_concurrency: int | None = None
    dialects: frozenset[str] = frozenset({"openai"})
    cache_salt: bool = False  # ModelConfig.upstream_cache_salt
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    local: bool = False  # the model's own worker (Config.models) is a replica too


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    supervisor: SupervisorConfig
    models: dict[str, ModelSpec]
    source: Path | None = None
    # Every key from api_keys, api_keys_file, CORRAL_API_KEYS and admin_keys.
    keys: Keyring = Keyring()
    # Models whose file cannot load (gone, not a GGUF file, cut short): name -> the
    # problem, as `models.<name>.path: ...`. Not a reason to refuse the file: `serve` and a
    # reload run the other models and show these as failed; `config check` fails on them.
    unloadable: dict[str, str] = field(default_factory=dict)
    # Models with an `upstream`: name -> where they are served. One with a `path` too is in
    # `models` as well, and its worker is one of the replicas.
    upstreams: dict[str, UpstreamSpec] = field(default_factory=dict)
    # The admin key sent to the [server] fleet's servers (read from fleet_key_env or
    # fleet_key_file), or None.
    fleet_key: str | None = None
    # Each served name with LoRA adapters, and each adapter model (`base =`): name -> the
    # adapters its requests apply (supervisor/config/lora.py).
    lora: dict[str, LoraView] = field(default_factory=dict)

    def resolve(self, name: str) -> ModelSpec | None:
        """The model a request's `model` field names, by name or alias; an adapter
        model's name resolves to its base, whose worker serves it."""
        spec = self.models.get(name)
        if spec is not None:
            return spec
        for spec in self.models.values():
            if name in spec.aliases:
                return spec
        view = self.adapter_model(name)
        return None if view is None else self.models.get(view.model)

    def lora_view(self, name: str) -> LoraView | None:
        """The adapters of the name (or alias) a request sent, or None: none apply."""
        view = self.lora.get(name)
        if view is not None:
            return view
        spec = self.resolve(name)
        if spec is not None and name in spec.aliases:
            return self.lora.get(spec.name)
        return next((v for v in self.lora.values() if name in v.aliases), None)

    def adapter_model(self, name: str) -> LoraView | None:
        """The adapter model a name or alias names, or None."""
        view = self.lora.get(name) or next((v for v in self.lora.values() if name in v.aliases), None)
        return view if view is not None and view.adapter_model else None

    def upstream(self, name: str) -> UpstreamSpec | None:
        """The upstream model a request's `model` field names, by name or alias."""
        spec = self.upstreams.get(name)
        if spec is not None:
            return spec
        return next((u for u in self.upstreams.values() if name in u.aliases), None)


def listen_hosts(server: ServerConfig) -> list[str]:
    """Every address `server` listens on."""
    return [server.host] if isinstance(server.host, str) else list(server.host)

