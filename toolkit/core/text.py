"""Text from input made safe to show: escaped so it cannot drive the terminal, and with no secret in it.

One place for both, used by the error renderer, `profile show`, `render`, reports and logs: a file name or a value
with an ANSI escape, a newline or a bidirectional control would otherwise draw a forged status line, and a URL's
`user:password@` or the value of a secret-named variable would end up in a terminal's scrollback or a CI log.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

MASK = "***"

# Words that make a name secret (API_KEY, HF_TOKEN, DB_PASSWORD, --admin-api-key), split at '-' and '_'.
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"})
# Words that end a secret-looking name but make it no secret: a path to one, or a reference to it.
_NOT_SECRET_TAIL = frozenset({"file", "path", "dir", "secret_ref", "env", "ref", "id"})
# scheme://user:password@ (and scheme://token@): the part before '@' is a credential.
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s:]*)(:[^/@\s]*)?@")
# NAME: value or NAME=value where NAME looks secret, in YAML text, env lines and argv.
_ASSIGNMENT = re.compile(
    r"(?m)^([ \t]*(?:-[ \t]+|export[ \t]+)?['\"]?)"  # indent, a list dash or `export`, a quote
    r"([A-Za-z_][A-Za-z0-9_.-]*)"  # the name
    r"(['\"]?[ \t]*[:=][ \t]*)(\S[^\n]*?)([ \t\r]*)$"  # `: ` or `=`, the value, trailing blanks
)


def secret_name(name: str) -> bool:
    """Whether a variable, flag or key name says its value is a secret (SGLANG_API_KEY, HF_TOKEN, --api-key)."""
    words = [w for w in re.split(r"[-_.]+", name.strip("-").lower()) if w]
    if not words or words[-1] in _NOT_SECRET_TAIL:
        return False
    return any(w in SECRET_WORDS for w in words)


def redact_url(text: str) -> str:
    """`scheme://user:pass@host` -> `scheme://***@host` (the user alone goes too: it may be a token)."""
    return _URL_CREDENTIALS.sub(lambda m: m.group(1) + MASK + "@", text)


def redact(text: str) -> str:
    """Credentials in URLs, and the values of secret-named assignments (`HF_TOKEN: x`, `API_KEY=x`), masked."""
    text = redact_url(text)

    def mask(m: re.Match[str]) -> str:
        # Upper-case names only: environment variables (HF_TOKEN: x); a lower-case profile key such as an
        # acknowledged rule id (public-bind-without-api-key: reason) is no secret.
        if m.group(2) != m.group(2).upper() or not secret_name(m.group(2)):
            return m.group(0)
        return m.group(1) + m.group(2) + m.group(3) + MASK + m.group(5)

    return _ASSIGNMENT.sub(mask, text)


def redact_argv(argv: Sequence[str], *, secret: Callable[[str], bool] = secret_name) -> list[str]:
    """The command as it may be stored or shown: values of flags whose name says secret (--api-key, --hf-token,
    whole words, so --tokenizer and --max-total-tokens stay readable) are replaced, and credentials in URLs cut
    out. `secret` decides on a flag's name (a usage error also hides the value of a mistyped secret flag)."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if a.startswith("-") and secret(a.partition("=")[0]):
            flag, eq, _ = a.partition("=")
            if eq:
                out.append(flag + "=" + MASK)
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(redact_url(a))
    return out


# A message quotes input (a value, a path): a word longer than this is cut, and so is a message, so that no
# input makes a message of a file's length.
MAX_WORD_CHARS = 160
MAX_MESSAGE_CHARS = 4000
_LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARS + 1},}}")


def shorten(text: str) -> str:
    """`text` with each word over MAX_WORD_CHARS cut to its start and its length, and the whole within
    MAX_MESSAGE_CHARS."""
    def cut(m: re.Match[str]) -> str:
        word = m.group(0)
        return f"{word[:MAX_WORD_CHARS // 2]}...({len(word):,} characters)"

    text = _LONG_WORD.sub(cut, text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = f"{text[:MAX_MESSAGE_CHARS - 40]}... ({len(text):,} characters in all)"
    return text


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character that does not show or drives the terminal escaped (C0 and C1 controls, ESC,
    DEL, bidirectional and zero-width format characters, line and paragraph separators, lone surrogates), so
    what is printed is what the input holds and nothing else. `keep_newlines`: a "\\n" stays a line break (a
    message of several lines the toolkit itself wrote, or a file shown as it is; a tab stays too)."""
    if text.isprintable() and text.isascii():
        return text
    if keep_newlines:  # a CRLF file's line ends are line ends
        text = text.replace("\r\n", "\n")
    return "".join(char if _shows(char) or (char in "\n\t" and keep_newlines) else _escape(char) for char in text)


def _shows(char: str) -> bool:
    return char == " " or (char.isprintable() and unicodedata.category(char) not in ("Cf", "Zl", "Zp", "Cs"))


# A secret reference names where the key is, not the key: it is shown (a literal key in its place is masked).
_REFERENCE = re.compile(r"^(env|vault|file):[^\s]+$")


def redact_data(data: object, key: str = "") -> object:
    """Plain data (a profile's, a report's) with every value of a secret-named key masked (a secret reference
    kept) and credentials cut out of every URL."""
    if isinstance(data, dict):
        return {k: redact_data(v, str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_data(v, key) for v in data]
    if isinstance(data, str):
        if key and secret_name(key) and not _REFERENCE.match(data):
            return MASK
        return redact_url(data)
    return data


def safe(text: str, *, keep_newlines: bool = False) -> str:
    """What every output of input-derived text goes through: redacted, then made printable."""
    return printable(redact(text), keep_newlines=keep_newlines)
