"""A generated world for the built-in "synthetic deep research" task (offline, seeded).

People (birth city, birth year, employer), cities (country) and organisations (base city), with
pronounceable generated names that no tokenizer has seen as words. The world renders into a corpus
of short documents, one per entity. People are split into train and held-out **by entity**: a
held-out person's questions never appear in SFT or RL data (see LEARNABILITY.md: with a few dozen
entities tiny models memorise; several hundred distinct training people make them learn to copy).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_ONSETS = [
    "b",
    "br",
    "d",
    "f",
    "g",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "v",
    "z",
    "h",
    "j",
    "c",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k"]


@dataclass(frozen=True)
class Person:
    name: str
    birth_city: str
    birth_year: int
    employer: str


@dataclass(frozen=True)
class City:
    name: str
    country: str


@dataclass(frozen=True)
class Org:
    name: str
    base: str


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    text: str


@dataclass
class World:
    seed: int
    people: dict[str, Person]
    cities: dict[str, City]
    orgs: dict[str, Org]
    countries: list[str]
    train_people: list[str]
    heldout_people: list[str]
    docs: list[Doc] = field(default_factory=list)

    def doc_by_id(self, doc_id: str) -> Doc | None:
        idx = int(doc_id[1:]) if doc_id[:1] == "d" and doc_id[1:].isdigit() else -1
        return self.docs[idx] if 0 <= idx < len(self.docs) else None


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)


def _unique_names(rng: random.Random, n: int, make: object, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = make()  # type: ignore[operator]
        if name not in taken and all(name not in t and t not in name for t in taken if len(t) > 3):
            taken.add(name)
            out.append(name)
    return out


def generate_world(
    seed: int = 0,
    *,
    n_people: int = 600,
    n_cities: int = 40,
    n_countries: int = 8,
    n_orgs: int = 30,
    heldout_fraction: float = 0.2,
) -> World:
    """Build a world deterministically from `seed`."""
    if n_people < 10 or n_cities < 2 or n_countries < 2 or n_orgs < 2:
        raise ValueError("a world needs at least 10 people, 2 cities, 2 countries and 2 organisations")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must lie in (0, 1), got {heldout_fraction}")
    rng = random.Random(seed)
    taken: set[str] = set()
    countries = [n.capitalize() for n in _unique_names(rng, n_countries, lambda: _word(rng, 2) + "ia", taken)]
    cities = {
        c.capitalize(): City(c.capitalize(), rng.choice(countries))
        for c in _unique_names(rng, n_cities, lambda: _word(rng, 2), taken)
    }
    city_names = list(cities)
    orgs = {
        o: Org(o, rng.choice(city_names))
        for o in (n.capitalize() + " Corp" for n in _unique_names(rng, n_orgs, lambda: _word(rng, 2), taken))
    }
    org_names = list(orgs)

    def person_name() -> str:
        return f"{_word(rng, 1).capitalize()} {_word(rng, 2).capitalize()}"

    people = {
        p: Person(p, rng.choice(city_names), rng.randint(1900, 1999), rng.choice(org_names))
        for p in _unique_names(rng, n_people, person_name, taken)
    }
    names = list(people)
    rng.shuffle(names)
    n_held = max(2, round(heldout_fraction * n_people))
    world = World(seed, people, cities, orgs, countries, sorted(names[n_held:]), sorted(names[:n_held]))
    world.docs = render_corpus(world)
    return world


def render_corpus(world: World) -> list[Doc]:
    """One short document per person, city and organisation; ids are d0, d1, ..."""
    texts: list[tuple[str, str]] = []
    for p in world.people.values():
        texts.append(
            (
                p.name,
                f"{p.name} was born in {p.birth_city} in {p.birth_year}. {p.name} works for {p.employer}.",
            )
        )
    for c in world.cities.values():
        texts.append((c.name, f"{c.name} is a city in {c.country}."))
    for o in world.orgs.values():
        texts.append((o.name, f"{o.name} is based in {o.base}."))
    return [Doc(f"d{i}", title, text) for i, (title, text) in enumerate(texts)]
