"""Test helper: systemd's command-line word splitting, written from systemd.service(5) "COMMAND LINES"
and systemd.syntax(7) (quotes, C escapes, `%%`, `$$`), to read rendered units back."""

from __future__ import annotations

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}


def split_systemd_words(text: str, *, expand: bool = True) -> list[str]:
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\n":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote = None
        if text[i] in "\"'":
            quote = text[i]
            i += 1
        while i < n:
            c = text[i]
            if quote and c == quote:
                i += 1
                break
            if not quote and c in " \t\n":
                break
            if c == "\\" and i + 1 < n:
                word.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                i += 2
                continue
            if c == "%":
                if text[i + 1 : i + 2] != "%":
                    raise ValueError(f"unescaped specifier at {i}: {text!r}")
                word.append("%")
                i += 2
                continue
            if expand and c == "$":
                if text[i + 1 : i + 2] == "$":
                    word.append("$")
                    i += 2
                    continue
                if text[i + 1 : i + 2] == "{":
                    end = text.index("}", i)
                    word.append(text[i : end + 1])  # left for systemd to expand
                    i = end + 1
                    continue
                raise ValueError(f"unescaped $ at {i}: {text!r}")
            word.append(c)
            i += 1
        words.append("".join(word))
    return words
