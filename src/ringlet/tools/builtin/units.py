"""What `calculate` understands besides arithmetic: unit conversions and percentages, in the words people
(and small models copying them) write: "7 inches in cm", "how many km is 13.1 miles", "50 f to c",
"15% of 80", "what percent of 250 is 75", "90 - 10%".

A fixed table, not a units library: the everyday units of length, mass, volume, speed, area, time and
temperature, US customary where the US and imperial differ (gallon, pint, cup, ton), each by its exact
definition. An unknown unit or a conversion between kinds is an error that names the units known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class UnitError(ValueError):
    """An unknown unit, or a conversion between different kinds of quantity."""


@dataclass(frozen=True, slots=True)
class Unit:
    symbol: str
    kind: str
    factor: float
    """In the kind's base unit: metre, kilogram, litre, metre per second, square metre, second."""


_INCH = 0.0254
_POUND = 0.45359237
_GALLON = 3.785411784
_UNITS: dict[tuple[str, str, float], tuple[str, ...]] = {
    ("mm", "length", 0.001): ("millimeter", "millimetre"),
    ("cm", "length", 0.01): ("centimeter", "centimetre"),
    ("m", "length", 1.0): ("meter", "metre"),
    ("km", "length", 1000.0): ("kilometer", "kilometre"),
    ("in", "length", _INCH): ("inch", "inches", '"'),
    ("ft", "length", 12 * _INCH): ("foot", "feet", "'"),
    ("yd", "length", 36 * _INCH): ("yard",),
    ("mi", "length", 63360 * _INCH): ("mile",),
    ("nmi", "length", 1852.0): ("nautical mile",),
    ("mg", "mass", 1e-6): ("milligram", "milligramme"),
    ("g", "mass", 0.001): ("gram", "gramme", "gr"),
    ("kg", "mass", 1.0): ("kilogram", "kilogramme", "kilo"),
    ("t", "mass", 1000.0): ("tonne", "metric ton"),
    ("oz", "mass", _POUND / 16): ("ounce",),
    ("lb", "mass", _POUND): ("pound", "lbs"),
    ("st", "mass", 14 * _POUND): ("stone",),
    ("ton", "mass", 2000 * _POUND): ("short ton", "us ton"),
    ("ml", "volume", 0.001): ("milliliter", "millilitre"),
    ("cl", "volume", 0.01): ("centiliter", "centilitre"),
    ("dl", "volume", 0.1): ("deciliter", "decilitre"),
    ("L", "volume", 1.0): ("l", "liter", "litre", "ltr"),
    ("m3", "volume", 1000.0): ("cubic meter", "cubic metre", "m^3"),
    ("tsp", "volume", _GALLON / 768): ("teaspoon",),
    ("tbsp", "volume", _GALLON / 256): ("tablespoon",),
    ("fl oz", "volume", _GALLON / 128): ("fluid ounce", "floz"),
    ("cup", "volume", _GALLON / 16): (),
    ("pt", "volume", _GALLON / 8): ("pint",),
    ("qt", "volume", _GALLON / 4): ("quart",),
    ("gal", "volume", _GALLON): ("gallon", "us gallon"),
    ("imp gal", "volume", 4.54609): ("imperial gallon", "uk gallon"),
    ("m/s", "speed", 1.0): ("meter per second", "metre per second", "mps"),
    ("km/h", "speed", 1000 / 3600): ("kph", "kmh", "kmph", "kilometer per hour", "kilometre per hour",
                                     "km per hour"),
    ("mph", "speed", 63360 * _INCH / 3600): ("mile per hour", "mi/h"),
    ("kn", "speed", 1852 / 3600): ("knot", "kt"),
    ("ft/s", "speed", 12 * _INCH): ("foot per second", "feet per second", "fps"),
    ("m2", "area", 1.0): ("square meter", "square metre", "sq m", "m^2"),
    ("km2", "area", 1e6): ("square kilometer", "square kilometre", "sq km", "km^2"),
    ("ft2", "area", (12 * _INCH) ** 2): ("square foot", "square feet", "sq ft", "ft^2"),
    ("mi2", "area", (63360 * _INCH) ** 2): ("square mile", "sq mi", "mi^2"),
    ("ha", "area", 10_000.0): ("hectare",),
    ("acre", "area", 4046.8564224): (),
    ("s", "time", 1.0): ("sec", "second"),
    ("min", "time", 60.0): ("minute",),
    ("h", "time", 3600.0): ("hr", "hour"),
    ("day", "time", 86400.0): ("d",),
    ("week", "time", 604800.0): ("wk",),
}
_TEMPERATURES = {"°C": ("c", "celsius", "centigrade", "degc"), "°F": ("f", "fahrenheit", "degf"),
                 "K": ("k", "kelvin", "degk")}
UNITS: dict[str, Unit] = {}
for (_symbol, _kind, _factor), _names in _UNITS.items():
    for _name in (_symbol, *_names):
        UNITS[_name] = Unit(_symbol, _kind, _factor)
for _symbol, _names in _TEMPERATURES.items():
    for _name in (_symbol.lower(), *_names):
        UNITS[_name] = Unit(_symbol, "temperature", 1.0)


def unit(name: str) -> Unit:
    """The unit of this name (case-insensitive; plural, "degrees", "square"/"sq" and "°" allowed)."""
    key = re.sub(r"\s+", " ", name.strip().lower().replace("°", " ").replace("degrees ", "").replace("degree ", ""))
    key = key.strip(" .")
    for candidate in (key, key.removesuffix("s"), key.removesuffix("es"), re.sub(r"s\b", "", key)):
        if candidate in UNITS:
            return UNITS[candidate]
    known = ", ".join(sorted({u.symbol for u in UNITS.values()}))
    raise UnitError(f"unknown unit {name.strip()!r}; known units: {known}")


def _to_kelvin(value: float, symbol: str) -> float:
    return {"°C": value + 273.15, "°F": (value - 32) * 5 / 9 + 273.15}.get(symbol, value)


def _from_kelvin(value: float, symbol: str) -> float:
    return {"°C": value - 273.15, "°F": (value - 273.15) * 9 / 5 + 32}.get(symbol, value)


def convert(value: float, source: str, target: str) -> tuple[float, Unit, Unit]:
    """`value` in `source` units expressed in `target` units, and the two units."""
    a, b = unit(source), unit(target)
    if a.kind != b.kind:
        raise UnitError(f"cannot convert {a.kind} ({a.symbol}) to {b.kind} ({b.symbol})")
    if a.kind == "temperature":
        return _from_kelvin(_to_kelvin(value, a.symbol), b.symbol), a, b
    return value * a.factor / b.factor, a, b


def number_text(value: float) -> str:
    """A result as people write it: an integer without ".0", else at most 6 significant digits."""
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:.6g}"


_NUM = r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+"
_UNIT = r"[a-z°\"'][a-z°/^0-9 .\"']*?"
_FILLER = re.compile(r"^(?:please\s+)?(?:what(?:'s| is| are)|how much is|calculate|compute|convert|find|"
                     r"evaluate|work out)\s+", re.I)
_CONVERSIONS = (
    re.compile(rf"^(?P<n>{_NUM})\s*(?P<a>{_UNIT})\s+(?:to|in|into|as|in to|=)\s+(?P<b>{_UNIT})$"),
    re.compile(rf"^how many\s+(?P<b>{_UNIT})\s+(?:is|are|in|make|equals?)\s+(?:there in\s+|in\s+)?"
               rf"(?P<n>{_NUM})\s*(?P<a>{_UNIT})$"),
)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def conversion(text: str) -> str | None:
    """"7 inches in cm" → "7 in = 17.78 cm"; None when `text` is not a conversion."""
    text = _FILLER.sub("", text.strip().lower().rstrip("?!. ")).strip()
    for pattern in _CONVERSIONS:
        match = pattern.match(text)
        if match:
            value, a, b = convert(_num(match["n"]), match["a"], match["b"])
            return f"{number_text(_num(match['n']))} {a.symbol} = {number_text(value)} {b.symbol}"
    return None


_PCT = r"(?:%|\s*percent|\s*per cent|\s*pct)"
_P = rf"(?P<p>{_NUM}){_PCT}"
_PERCENTAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"^{_P}\s+of\s+(?P<x>{_NUM})$"), "of"),
    (re.compile(rf"^{_P}\s+off\s+(?:of\s+)?(?P<x>{_NUM})$"), "off"),
    (re.compile(rf"^(?P<x>{_NUM})\s*(?:-|minus|less|decreased by|reduced by)\s*{_P}(?:\s+off)?$"), "off"),
    (re.compile(rf"^(?P<x>{_NUM})\s*(?:\+|plus|increased by|raised by)\s*{_P}$"), "plus"),
    (re.compile(rf"^(?P<x>{_NUM})\s+with\s+{_P}\s+off$"), "off"),
    (re.compile(rf"^what\s+(?:percent(?:age)?|%)\s+of\s+(?P<whole>{_NUM})\s+is\s+(?P<part>{_NUM})$"), "ratio"),
    (re.compile(rf"^(?P<part>{_NUM})\s+is\s+what\s+(?:percent(?:age)?|%)\s+of\s+(?P<whole>{_NUM})$"), "ratio"),
    (re.compile(rf"^what\s+(?:percent(?:age)?|%)\s+is\s+(?P<part>{_NUM})\s+(?:of|out of)\s+(?P<whole>{_NUM})$"),
     "ratio"),
    (re.compile(rf"^(?P<part>{_NUM})\s+(?:as a\s+)?(?:percent(?:age)?|%)\s+of\s+(?P<whole>{_NUM})$"), "ratio"),
    (re.compile(rf"^(?P<part>{_NUM})\s+(?:of|out of|/)\s+(?P<whole>{_NUM})\s+(?:as a|in)\s+percent(?:age)?$"),
     "ratio"),
)


def percentage(text: str) -> str | None:
    """"15% of 80" → "15% of 80 = 12", "what percent of 250 is 75" → "75 is 30% of 250", "90 - 10%" →
    "90 minus 10% = 81"; None when `text` is none of these."""
    text = _FILLER.sub("", text.strip().lower().rstrip("?!. ")).strip()
    for pattern, kind in _PERCENTAGES:
        match = pattern.match(text)
        if match is None:
            continue
        if kind == "ratio":
            part, whole = _num(match["part"]), _num(match["whole"])
            if whole == 0:
                raise ZeroDivisionError("a percentage of zero")
            return f"{number_text(part)} is {number_text(part / whole * 100)}% of {number_text(whole)}"
        p, x = _num(match["p"]), _num(match["x"])
        if kind == "of":
            return f"{number_text(p)}% of {number_text(x)} = {number_text(p / 100 * x)}"
        sign = 1 if kind == "plus" else -1
        word = "plus" if kind == "plus" else "minus"
        return f"{number_text(x)} {word} {number_text(p)}% = {number_text(x * (1 + sign * p / 100))}"
    return None


_WORDS = ((r"\bdivided by\b", "/"), (r"\bover\b", "/"), (r"\btimes\b|\bmultiplied by\b|(?<=\d)\s*x\s*(?=\d)", "*"),
          (r"\bplus\b", "+"), (r"\bminus\b", "-"), (r"\bto the power of\b|\^", "**"),
          (r"\bsquared\b", "** 2"), (r"\bcubed\b", "** 3"), (r"\bsquare root of\b", "sqrt"),
          (r"(?<=\d),(?=\d{3}\b)", ""))
_BARE_PERCENT = re.compile(rf"(?P<p>{_NUM}){_PCT}(?!\s*[\d(.])")


def arithmetic_text(text: str) -> str:
    """An arithmetic expression in words ("2.5 times 1.6", "how much is 5 cubed?", "75% * 120") as
    Python arithmetic ("2.5 * 1.6", "5 ** 3", "(75 / 100) * 120")."""
    text = _FILLER.sub("", text.strip().rstrip("?!= ")).strip()
    for pattern, replacement in _WORDS:
        text = re.sub(pattern, replacement, text, flags=re.I)
    text = re.sub(r"\bsqrt\s+(\d+(?:\.\d+)?)", r"sqrt(\1)", text)
    return _BARE_PERCENT.sub(lambda m: f"({m['p']} / 100)", text)
