"""Needle-in-a-haystack prompts for a base model: one secret code among filler sentences, asked for at the end."""

from __future__ import annotations

import random
from dataclasses import dataclass

FILLER = [
    "The grass is green and the sky is blue.",
    "The sun rises in the east and sets in the west.",
    "Rivers flow from the mountains down to the sea.",
    "A library keeps books on many different subjects.",
    "Trains leave the station every hour on the hour.",
    "The market sells fresh bread, cheese and apples.",
    "Birds build their nests in the tall oak trees.",
    "The old bridge crosses the river near the mill.",
    "Children play football in the park after school.",
    "The museum opens at nine and closes at five.",
    "Snow covers the hills for most of the winter.",
    "The baker starts work long before sunrise.",
    "Ships wait in the harbour for the tide to turn.",
    "The garden has roses, tulips and a small pond.",
    "Farmers harvest the wheat at the end of summer.",
    "The clock on the tower strikes twelve at noon.",
    "Cats like to sleep in warm and quiet places.",
    "The road to the village winds through the forest.",
    "Rain falls softly on the roofs of the town.",
    "The teacher writes the lesson on the blackboard.",
]


@dataclass(frozen=True)
class Needle:
    prompt: str
    code: str
    needle: str  # the sentence holding the code, as it appears in the prompt


# The Gemma 3 270M sweep (conftest.py's gemma_needles, read by test_gemma_needle.py and test_server_gemma_needle.py):
# 20 prompts from about 1,000 to 2,500 tokens, needles at depths spread over 10-90%
SWEEP = [(100 + 150 * i // 19, 0.1 + 0.8 * ((i * 7) % 20) / 19, 1000 + i) for i in range(20)]


def make_needle(n_sentences: int, depth: float, seed: int) -> Needle:
    """A prompt of about n_sentences filler sentences with the needle at `depth` (0..1) of the way through."""
    rng = random.Random(seed)
    code = f"{rng.randrange(1000, 10000)}"
    needle = f"The secret code is {code}. Remember the secret code {code}."
    sentences = [rng.choice(FILLER) for _ in range(n_sentences)]
    sentences.insert(int(depth * n_sentences), needle)
    prompt = " ".join(sentences) + "\nQuestion: What is the secret code?\nAnswer: The secret code is"
    return Needle(prompt, code, needle)
