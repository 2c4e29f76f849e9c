"""Is a W&B API key configured here? The places wandb 0.31 itself reads at wandb.init (its
sdk/lib/wbauth), read with the standard library only (importing wandb costs ~0.6 s):

1. WANDB_API_KEY (or WANDB_IDENTITY_TOKEN_FILE naming a file);
2. a netrc entry for the W&B host ($NETRC, else ~/.netrc or ~/_netrc): what `wandb login`
   writes; the host is WANDB_BASE_URL's, else the settings file's base_url, else api.wandb.ai;
3. api_key in wandb's settings file ($WANDB_CONFIG_DIR/settings, else ~/.config/wandb/settings).

The key is never read out or shown: only where one was found.
"""
from __future__ import annotations

import configparser
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "https://api.wandb.ai"


def credentials_source() -> str | None:
    """Where wandb.init would find a key (e.g. "WANDB_API_KEY", "~/.netrc"); None: nowhere."""
    if os.environ.get("WANDB_API_KEY", "").strip():
        return "WANDB_API_KEY"
    token_file = os.environ.get("WANDB_IDENTITY_TOKEN_FILE", "")
    if token_file and Path(token_file).expanduser().is_file():
        return "WANDB_IDENTITY_TOKEN_FILE"
    found = _netrc_source(urlsplit(base_url()).netloc)
    if found:
        return found
    if _settings().get("api_key", "").strip():
        return str(_settings_path())
    return None


def base_url() -> str:
    """The W&B server wandb.init would talk to."""
    return os.environ.get("WANDB_BASE_URL") or _settings().get("base_url") or DEFAULT_BASE_URL


def _netrc_path() -> Path:
    if os.environ.get("NETRC"):
        return Path(os.environ["NETRC"]).expanduser()
    unix = Path("~/.netrc").expanduser()
    windows = Path("~/_netrc").expanduser()
    return windows if windows.exists() and not unix.exists() else unix


def _netrc_source(host: str) -> str | None:
    path = _netrc_path()
    if not host or not path.is_file():
        return None
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return None
    return str(path) if entry and entry[2] else None


def _settings_path() -> Path:
    folder = os.environ.get("WANDB_CONFIG_DIR") or "~/.config/wandb"
    return Path(folder).expanduser() / "settings"


def _settings() -> dict[str, str]:
    parser = configparser.ConfigParser()
    try:
        parser.read(_settings_path())
    except (configparser.Error, OSError, UnicodeDecodeError):
        return {}
    return dict(parser["default"]) if parser.has_section("default") else {}
