"""Personal data in text: e-mail addresses, phone numbers, card numbers (Luhn checksum and a card network's
prefix), IBANs (the country's length and the mod-97 checksum), national ids (US social security numbers
and UK national insurance numbers, by their allocation rules) and custom patterns.

`find_pii(text)` lists the spans found; `PiiGuardrail` redacts them (`[email]`, …) or blocks the text.
Phone numbers are found by Google's libphonenumber rules (the `phonenumbers` package, the `guardrails`
extra): numbers in international form anywhere, national ones as `region` writes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ringlet.errors import ConfigError
from ringlet.guardrails.base import ALLOW, STAGES, Block, Checked, Redact, Span, Stage, Verdict

PiiKind = Literal["email", "phone", "card", "iban", "national_id"]
PII_KINDS: tuple[PiiKind, ...] = ("email", "phone", "card", "iban", "national_id")

EMAIL = re.compile(r"(?<![\w.+%-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]*[A-Za-z0-9_+-])?@"
                   r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])")
CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")
CARD_PREFIX = re.compile(r"4|5[1-5]|2[2-7]|3[47]|3[068]|35|6(?:011|5|4[4-9]|2)")
IBAN_START = re.compile(r"(?<![A-Za-z0-9])([A-Z]{2})(\d{2})(?=[ ]?[A-Z0-9])")
SSN = re.compile(r"(?<![\w-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\w-])")
NINO = re.compile(r"(?<![A-Za-z0-9])(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
                  r" ?\d{2} ?\d{2} ?\d{2} ?[A-D](?![A-Za-z0-9])")

# IBAN lengths by country (ISO 13616 registry)
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24,
    "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21,
    "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LI": 21,
    "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30,
    "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}


def luhn(digits: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = int(c)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """The country's length and the mod-97 checksum (ISO 7064)."""
    if IBAN_LENGTHS.get(iban[:2]) != len(iban):
        return False
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _cards(text: str) -> Iterable[Span]:
    for m in CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and CARD_PREFIX.match(digits) and luhn(digits):
            yield Span(m.start(), m.end(), "card")


def _ibans(text: str) -> Iterable[Span]:
    for m in IBAN_START.finditer(text):
        want = IBAN_LENGTHS.get(m.group(1))
        if want is None:
            continue
        chars, i = [m.group(1), m.group(2)], m.end()
        count = 4
        while count < want and i < len(text):
            if text[i] == " " and i + 1 < len(text) and text[i + 1].isalnum():
                i += 1
            if not (text[i].isdigit() or "A" <= text[i] <= "Z"):
                break
            chars.append(text[i])
            count, i = count + 1, i + 1
        if count == want and not (i < len(text) and text[i].isalnum()) and iban_valid("".join(chars)):
            yield Span(m.start(), i, "iban")


def _national_ids(text: str) -> Iterable[Span]:
    for pattern in (SSN, NINO):
        for m in pattern.finditer(text):
            yield Span(m.start(), m.end(), "national_id")


def _emails(text: str) -> Iterable[Span]:
    return (Span(m.start(), m.end(), "email") for m in EMAIL.finditer(text))


def _phonenumbers() -> Any:
    try:
        import phonenumbers  # pyright: ignore[reportMissingImports]  (the `guardrails` extra)
    except ImportError:
        raise ConfigError("finding phone numbers needs the `phonenumbers` package: pip install "
                          "'ringlet[guardrails]' (or leave `phone` out of the PII kinds)") from None
    return phonenumbers


def _phones(text: str, region: str) -> Iterable[Span]:
    phonenumbers = _phonenumbers()
    for m in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
        before = text[m.start - 1] if m.start else " "
        if not (before.isalnum() or before in "-_/#"):  # part of a longer code (INV-2023-000187)
            yield Span(m.start, m.end, "phone")


def find_pii(text: str, kinds: Iterable[str] = PII_KINDS, *, custom: Mapping[str, re.Pattern[str]] | None = None,
             region: str = "US") -> list[Span]:
    """The spans of personal data in `text`, in order, none overlapping (a card or IBAN number is not also
    a phone number). `custom`: more kinds, each a compiled pattern."""
    wanted = set(kinds)
    found: list[Span] = []
    finders = [("card", _cards), ("iban", _ibans), ("national_id", _national_ids), ("email", _emails)]
    candidates = [s for kind, finder in finders if kind in wanted for s in finder(text)]
    candidates += [Span(m.start(), m.end(), name) for name, pattern in (custom or {}).items()
                   for m in pattern.finditer(text) if m.end() > m.start()]
    if "phone" in wanted and any(c.isdigit() for c in text):
        candidates += list(_phones(text, region))
    for span in candidates:  # first come first kept: the checked kinds before phone numbers
        if all(span.end <= s.start or span.start >= s.end for s in found):
            found.append(span)
    return sorted(found, key=lambda s: s.start)


@dataclass(slots=True)
class PiiGuardrail:
    """Redacts personal data (`[email]`, `[card]`, …; `replacement` is a format with `{kind}`) or, with
    `action="block"`, blocks a text that holds any."""

    kinds: tuple[str, ...] = PII_KINDS
    custom: dict[str, str] = field(default_factory=dict)
    """Custom kinds: name → regular expression."""
    action: Literal["redact", "block"] = "redact"
    stages: frozenset[Stage] = frozenset(STAGES)
    region: str = "US"
    """Where phone numbers written without a country code are read as national ones (ISO 3166 code)."""
    replacement: str = "[{kind}]"
    name: str = "pii"
    _patterns: dict[str, re.Pattern[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in PII_KINDS]
        if unknown:
            raise ConfigError(f"PII guardrail {self.name!r}: unknown kind {unknown[0]!r} (kinds: "
                              f"{', '.join(PII_KINDS)}; add others as `custom` patterns)")
        if "phone" in self.kinds:
            _phonenumbers()  # a missing package is a configuration error, not a failure mid-run
        self._patterns = {}
        for kind, pattern in self.custom.items():
            try:
                self._patterns[kind] = re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"PII guardrail {self.name!r}: custom pattern {kind!r} is not a regular "
                                  f"expression: {exc}") from None

    async def check(self, text: str, at: Checked) -> Verdict:
        return self.decide(text)

    def decide(self, text: str) -> Verdict:
        spans = find_pii(text, self.kinds, custom=self._patterns, region=self.region)
        if not spans:
            return ALLOW
        kinds = tuple(dict.fromkeys(s.kind for s in spans))
        if self.action == "block":
            return Block(reason=f"the text holds personal data ({', '.join(kinds)})", kinds=kinds)
        return Redact(spans=tuple(Span(s.start, s.end, s.kind, self.replacement.format(kind=s.kind))
                                  for s in spans))
