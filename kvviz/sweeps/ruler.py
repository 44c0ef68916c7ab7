"""RULER's string-match metrics (as kvpress' evaluation scores its RULER runs) and small RULER- and SCBench-style
task generators sized for the bundled model, seeded by their names (nothing downloaded, the same text every run).

Metrics, per prediction ``pred`` and its reference answers ``refs`` (case ignored, RULER's ``string_match_all`` and
``string_match_part``): *all* is the share of the references found in the prediction, *part* is 1 when any is. RULER
and kvpress score ``qa`` tasks with *part* and every other task with *all*.
"""

from __future__ import annotations

import random

from kvviz.sweeps.prompts import Prompt, filler

METRICS = ("string_match_all", "string_match_part")


def string_match(prediction: str, answers: tuple[str, ...] | list[str], metric: str) -> float:
    """RULER's score of one prediction in [0, 1]: ``string_match_all`` the share of ``answers`` it contains,
    ``string_match_part`` 1.0 if it contains any (case ignored)."""
    found = [answer.lower() in prediction.lower() for answer in answers]
    if metric == "string_match_all":
        return sum(found) / len(found)
    if metric == "string_match_part":
        return float(any(found))
    raise ValueError(f"unknown metric {metric!r}; RULER's: {', '.join(METRICS)}")


def metric_for(task: str) -> str:
    """The metric RULER and kvpress give ``task``: ``string_match_part`` for ``qa*`` tasks, else ``_all``."""
    return "string_match_part" if task.split("_")[0] == "qa" else "string_match_all"


def _case(ident: str, text: str, answers: list[str], task: str, turns: tuple[str, ...] = ()) -> Prompt:
    return Prompt(ident, (*turns, text), None, task, tuple(answers), metric_for(task))


def multikey_needles(keys: tuple[int, ...] = (4, 8), sentences: int = 60) -> list[Prompt]:
    """RULER's niah_multikey: ``keys`` special magic numbers hidden among filler sentences, one of them asked."""
    prompts = []
    for count in keys:
        rng = random.Random(f"niah_multikey-{count}")
        names = rng.sample(["amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "iris", "jade"],
                           count)
        numbers = {name: str(rng.randint(100000, 999999)) for name in names}
        text = filler(rng, sentences)
        for name in names:
            text.insert(rng.randrange(len(text) + 1), f"One of the special magic numbers for {name} is: "
                                                       f"{numbers[name]}.")
        asked = rng.choice(names)
        question = (" ".join(text) + f"\n\nWhat is the special magic number for {asked} mentioned in the provided "
                    "text? Answer with the number only.")
        prompts.append(_case(f"niah_multikey-{count}", question, [numbers[asked]], "niah_multikey"))
    return prompts


def common_words(vocabulary: int = 30, frequent: int = 3) -> list[Prompt]:
    """RULER's cwe: a numbered list of words in which ``frequent`` words appear most often; all of them asked."""
    rng = random.Random(f"cwe-{vocabulary}-{frequent}")
    words = rng.sample(["apple", "bridge", "candle", "desert", "engine", "forest", "guitar", "hammer", "island",
                        "jacket", "kettle", "ladder", "marble", "needle", "orange", "pepper", "quartz", "rocket",
                        "saddle", "tunnel", "umbrella", "violin", "wagon", "yellow", "zipper", "anchor", "basket",
                        "carpet", "dragon", "falcon"], vocabulary)
    common, rare = words[:frequent], words[frequent:]
    listed = [w for w in common for _ in range(6)] + [w for w in rare for _ in range(rng.randint(1, 3))]
    rng.shuffle(listed)
    lines = "\n".join(f"{index}. {word}" for index, word in enumerate(listed, start=1))
    question = (f"Below is a numbered list of words. In these words, some appear more often than others.\n{lines}\n\n"
                f"What are the {frequent} most common words in the above list? Answer with the words only.")
    return [_case(f"cwe-{vocabulary}", question, common, "cwe")]


def variable_chains(hops: tuple[int, ...] = (2, 4)) -> list[Prompt]:
    """RULER's vt: a value passed along ``hops`` assignments among filler; every variable holding it is asked."""
    prompts = []
    for count in hops:
        rng = random.Random(f"vt-{count}")
        value = str(rng.randint(10000, 99999))
        chain = [f"V{rng.randint(100, 999)}{index}" for index in range(count + 1)]
        lines = [f"VAR {chain[0]} = {value}."]
        for index in range(1, count + 1):
            lines += [*filler(rng, 3), f"VAR {chain[index]} = VAR {chain[index - 1]}."]
        question = ("\n".join(lines) + f"\n\nFind all variables that are assigned the value {value} in the text "
                    "above. Answer with the variable names only.")
        prompts.append(_case(f"vt-{count}", question, chain, "vt"))
    return prompts


def follow_up(sentences: int = 40) -> list[Prompt]:
    """SCBench's kind of multi-turn case: the first turn carries facts among filler and asks about one; the second
    asks about another, which only the first turn's text holds (a policy that dropped it at turn 1 fails turn 2)."""
    rng = random.Random(f"multiturn-{sentences}")
    people = rng.sample(["Ada", "Bruno", "Chen", "Dalia", "Emil", "Farah"], 3)
    cities = dict(zip(people, rng.sample(["Lisbon", "Oslo", "Quito", "Nairobi", "Hanoi", "Perth"], 3)))
    text = filler(rng, sentences)
    for person in people:
        text.insert(rng.randrange(len(text) + 1), f"{person} moved to {cities[person]} last spring.")
    first = " ".join(text) + f"\n\nWhere did {people[0]} move? Answer with the city only."
    second = f"And where did {people[2]} move? Answer with the city only."
    return [_case("multiturn-1", second, [cities[people[2]]], "qa_multiturn", (first,))]


SETS = {"niah_multikey": multikey_needles, "cwe": common_words, "vt": variable_chains, "multiturn": follow_up}


def ruler_set(name: str) -> list[Prompt]:
    """A set by name; ``ruler``: every RULER-style set and the multi-turn one."""
    if name == "ruler":
        return [prompt for make in SETS.values() for prompt in make()]
    return SETS[name]()
