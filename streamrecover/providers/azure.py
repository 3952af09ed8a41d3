"""Azure OpenAI's URL scheme and ``api-key`` header, for the Chat and Responses adapters.

Azure serves the same wire formats behind a resource endpoint (``BASE_URL``, e.g.
``https://{resource}.openai.azure.com``) in two forms. The v1 API (no ``api-version``):
``{base}/openai/v1/chat/completions`` and ``{base}/openai/v1/responses``, the deployment
name in the body's ``model``. The dated API (``AZURE_API_VERSION`` set):
``{base}/openai/deployments/{deployment}/chat/completions?api-version=...`` and
``{base}/openai/responses?api-version=...``. Either way the key goes in an ``api-key``
header instead of ``Authorization: Bearer``.
"""

from __future__ import annotations

from urllib.parse import urlencode

from ..engine.contract import ProviderConfig
from .modelname import path_segment

CHAT_PATH = "/chat/completions"


def azure_headers(config: ProviderConfig) -> dict[str, str]:
    return {"api-key": config.api_key}


def deployment(config: ProviderConfig, model: str) -> str:
    """The deployment a request goes to: the configured one, else the model name."""
    return config.azure_deployment or model


def azure_url(config: ProviderConfig, path: str, *, model: str = "") -> str:
    """The URL of ``path`` (``/chat/completions``, ``/responses``, ``/responses/{id}``) on Azure."""
    base = config.base_url.rstrip("/")
    version = config.azure_api_version
    if not version:
        return f"{base}/openai/v1{path}"
    if path == CHAT_PATH:
        url = f"{base}/openai/deployments/{path_segment(deployment(config, model))}{path}"
    else:
        url = f"{base}/openai{path}"
    return f"{url}?{urlencode({'api-version': version})}"
