"""Chat templates: the jinja2 ``tokenizer.chat_template`` of a GGUF file, rendered in a sandbox."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specround.errors import InputError, ModelLoadError

__all__ = ["ChatTemplate"]


def _raise_exception(message: str) -> NoReturn:
    raise InputError(f"chat template refused the conversation: {message}")


class ChatTemplate:
    """A compiled chat template (the same jinja2 settings transformers uses: trim and lstrip blocks)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ModelLoadError(f"chat template does not compile: {exc}") from exc
        self.source = source
        """The template text."""
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (dicts with ``role`` and ``content``)."""
        for message in messages:
            if "role" not in message or "content" not in message:
                raise InputError("every chat message needs 'role' and 'content'")
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                **self._specials,
            )
        except TemplateError as exc:
            raise InputError(f"chat template failed to render: {exc}") from exc
