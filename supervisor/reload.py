"""What a config reload changes: a pure comparison of two validated configs.

Like supervisord's reread: models are added, removed, changed or unchanged, compared as
whole resolved specs (path, aliases, slots, ..., and the idle_timeout they inherit).
Server settings cannot change on a live socket, so they are only reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.config import Config, ServerConfig


# [server] keys that a reload applies at once; every other one is read when the socket opens.
LIVE_SERVER_KEYS = frozenset(
    {
        "default_model", "unknown_model", "api_keys", "api_keys_file", "admin_keys", "models_dir", "cors_origins",
        "allowed_hosts", "slots_endpoint", "v1_error_shape", "verbose_responses", "public_metrics",
        "max_keep_alive", "slot_save_path", "slot_save_max_bytes", "slot_actions", "hosted_tools", "responses_ttl",
        "responses_max_bytes", "models_autoload",
        "fleet", "fleet_key_env", "fleet_key_file",
    }
)


@dataclass(frozen=True)
class ConfigDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    # "server.port", ...: differ in the new file, take effect only after a restart
    needs_restart: tuple[str, ...]
    # Models in the new file whose file cannot load: name -> `models.<name>.path: ...`.
    # They are FAILED; every other model is served as the file says.
    unloadable: dict[str, str] = field(default_factory=dict)
    # Models served elsewhere (Config.upstreams), apart: no worker starts or stops for them,
    # and the relay reads the new file's replicas at the next request.
    upstreams_added: tuple[str, ...] = ()
    upstreams_removed: tuple[str, ...] = ()
    upstreams_changed: tuple[str, ...] = ()
    # Names whose LoRA adapters or scales changed (Config.lora), apart: the router applies
    # them from the next request; a base worker restarts only when the files it loads change.
    adapters_changed: tuple[str, ...] = ()

    def summary(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", self.changed),
                ("added upstream", self.upstreams_added),
                ("removed upstream", self.upstreams_removed),
                ("changed upstream", self.upstreams_changed),
                ("changed adapters of", self.adapters_changed),
            )
            if names
        ]
        if self.needs_restart:
            parts.append(f"needs a restart for {', '.join(self.needs_restart)}")
        if self.unloadable:
            parts.append(f"cannot load {', '.join(self.unloadable)}")
        return "; ".join(parts) or "no changes"


def diff(old: Config, new: Config, listening: ServerConfig | None = None) -> ConfigDiff:
    """`listening` is the server section the process started with, if it differs from
    `old.server`: after a reload that changed the port, the socket still listens on the
    first one, so a second reload must keep reporting the change until a restart."""
    live = listening or old.server
    old_names, new_names = set(old.models), set(new.models)
    common = sorted(old_names & new_names)
    return ConfigDiff(
        added=tuple(sorted(new_names - old_names)),
        removed=tuple(sorted(old_names - new_names)),
        changed=tuple(n for n in common if old.models[n] != new.models[n]),
        unchanged=tuple(n for n in common if old.models[n] == new.models[n]),
        needs_restart=tuple(
            f"server.{name}"
            for name in live.__struct_fields__
            if name not in LIVE_SERVER_KEYS and getattr(live, name) != getattr(new.server, name)
        ),
        unloadable=dict(new.unloadable),
        upstreams_added=tuple(sorted(set(new.upstreams) - set(old.upstreams))),
        upstreams_removed=tuple(sorted(set(old.upstreams) - set(new.upstreams))),
        upstreams_changed=tuple(
            sorted(n for n in set(old.upstreams) & set(new.upstreams) if old.upstreams[n] != new.upstreams[n])
        ),
        adapters_changed=tuple(sorted(n for n in set(old.lora) | set(new.lora) if old.lora.get(n) != new.lora.get(n))),
    )
