"""The registry of pretrained models: names -> file, sha256 and where the weights come from.

`registry.json` beside this module lists the models shipped with gedl-jax. Each entry:
    file        the model file's name, beside the registry (shipped), or in the download folder
    size, sha256 of the file's bytes: checked before every use
    weights_sha256  the weights' own checksum (`fileformat.weights_sha256`), checked at load: a
                file whose weights were changed and whose sha256 was then registered again is
                still refused (newer files also record it inside)
    url         where to fetch a file that is not shipped ("" for a shipped file); fetched by the
                data downloader (`gedl_jax.data.download`): verified while it streams, the mirror
                ($GEDL_DATA_MIRROR: <mirror>/pretrained/<file>) and the offline switch
                ($GEDL_OFFLINE=1) as for data; into <cache folder>/pretrained/
    dataset, variant, method, setting, seed, checkpoint, commit, versions, hardware, wall_time,
    results_dir, headline: what the model is and how it was made (see docs/pretrained.md)
    evaluation  (optional) where the evaluation the file carries was computed, when not on the
                machine that trained it, and how it compares with the run's own

Another registry (e.g. a test's, or a lab's own models) is used with `registry=PATH` or
$GEDL_PRETRAINED_REGISTRY.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

ENV_REGISTRY = "GEDL_PRETRAINED_REGISTRY"
PACKAGE_REGISTRY = pathlib.Path(__file__).with_name("registry.json")
REGISTRY_FORMAT = 1
PathLike = str | os.PathLike


class PretrainedError(ValueError):
    """A pretrained model cannot be used as asked; the message says what to do."""


class PretrainedChecksumError(PretrainedError):
    """A model file's bytes are not the registered ones."""


def registry_path(registry: PathLike | None = None) -> pathlib.Path:
    """`registry` if given, else $GEDL_PRETRAINED_REGISTRY, else the package's registry.json."""
    chosen = registry or os.environ.get(ENV_REGISTRY, "").strip()
    return pathlib.Path(chosen).expanduser() if chosen else PACKAGE_REGISTRY


def read_registry(registry: PathLike | None = None) -> dict[str, dict[str, Any]]:
    """{name: entry} of the registry (an empty one if the file does not exist yet)."""
    path = registry_path(registry)
    if not path.is_file():
        if path == PACKAGE_REGISTRY:
            return {}
        raise PretrainedError(f"the pretrained-model registry {path} does not exist; give an "
                              f"existing registry JSON (or unset ${ENV_REGISTRY})")
    try:
        content = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PretrainedError(f"the pretrained-model registry {path} is not valid JSON ({e})"
                              ) from None
    if content.get("format") != REGISTRY_FORMAT or not isinstance(content.get("models"), dict):
        raise PretrainedError(f"{path} is not a gedl-jax pretrained-model registry (format "
                              f"{REGISTRY_FORMAT} with a 'models' map)")
    return content["models"]


def get_entry(name: str, registry: PathLike | None = None) -> dict[str, Any]:
    """The registry entry of `name`; an unknown name lists the known ones."""
    models = read_registry(registry)
    if name not in models:
        known = ", ".join(sorted(models)) or "none"
        raise PretrainedError(f"no pretrained model named {name!r}; available: {known} "
                              f"(python -m gedl_jax.evaluate --pretrained=list)")
    return models[name]


def write_entry(registry: PathLike, name: str, entry: dict[str, Any]) -> pathlib.Path:
    """Add or replace `name` in the registry JSON at `registry` (created if missing); sorted,
    so the file changes only where an entry does."""
    from gedl_jax import files

    path = pathlib.Path(registry)
    models = read_registry(path) if path.is_file() else {}
    models[name] = entry
    content = {"format": REGISTRY_FORMAT, "models": dict(sorted(models.items()))}
    return files.write_text(path, json.dumps(content, indent=2, sort_keys=True) + "\n")


def _verify(path: pathlib.Path, name: str, entry: dict[str, Any]) -> None:
    from gedl_jax.data.cache import sha256_file

    digest = sha256_file(path)
    if digest != entry["sha256"]:
        if path.parent == PACKAGE_REGISTRY.parent:
            where = ("the installed copy is damaged or was replaced: reinstall gedl-jax (or "
                     "`git checkout` the file in a clone)")
        elif path.parent.name == "pretrained" and entry.get("url"):
            where = f"download it again: delete {path} and rerun"
        else:
            where = ("replace it with the registered file, or register the file you mean "
                     "(python -m gedl_jax.pretrained export ... --register)")
        raise PretrainedChecksumError(
            f"{name}: {path} has sha256 {digest}, not the registered {entry['sha256']}; {where}")


def model_file(name: str, registry: PathLike | None = None, *, download: str | None = None,
               mirror: str | None = None, cache_dir: PathLike | None = None) -> pathlib.Path:
    """The verified model file of `name`: beside the registry when shipped, else in
    <cache folder>/pretrained/ (fetched from the entry's url, or the mirror, when missing and
    downloads are allowed)."""
    entry = get_entry(name, registry)
    beside = registry_path(registry).parent / entry["file"]
    if beside.is_file():
        _verify(beside, name, entry)
        return beside
    return _downloaded(name, entry, download=download, mirror=mirror, cache_dir=cache_dir)


def _downloaded(name: str, entry: dict[str, Any], *, download: str | None, mirror: str | None,
                cache_dir: PathLike | None) -> pathlib.Path:
    from gedl_jax.data import cache as cache_lib
    from gedl_jax.data import download as dl
    from gedl_jax.data.registry import FileSpec

    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    target = cache_root / "pretrained" / entry["file"]
    mirror = dl.mirror_location(mirror)
    if not target.is_file() and dl.download_mode(download) == "never":
        raise PretrainedError(
            f"{name}: {entry['file']} is not shipped and not downloaded, and downloads are off "
            f"(${dl.ENV_OFFLINE} or download=never): allow downloads, or put the file at\n"
            f"  {target}   (from {entry.get('url') or 'the mirror'})")
    if not entry.get("url") and not mirror and not target.is_file():
        raise PretrainedError(f"{name}: {entry['file']} is neither beside the registry nor in "
                              f"{target.parent}, and the registry gives no url")
    spec = FileSpec(entry["file"], int(entry["size"]), entry["sha256"], entry.get("url", ""),
                    "gedl_jax")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        dl.fetch_file(spec, "pretrained", target.parent, mirror=mirror,
                      force=dl.download_mode(download) == "force", cache_root=cache_root)
    except dl.ChecksumError as e:
        raise PretrainedChecksumError(f"{name}: {e}") from None
    except dl.DownloadError as e:
        raise PretrainedError(f"{name}: cannot download {entry['file']}: {e}") from None
    _verify(target, name, entry)
    return target
