"""Data and metric for Silero VAD's sequence export (silero-vad 6.2.3, ``silero_vad_16k_sequence.onnx``).

The file takes ``input`` [frames, 576] plus the LSTM state ``h`` and ``c`` [1, 1, 128] and returns
``speech_probs`` [frames] (then ``hn``, ``cn``). deploy_opt's data contract puts the batch on axis 0 of every
input and refuses inputs that disagree on it, and the state's axis 0 is the LSTM's layer, not the frames. So
``prepare()`` writes ``silero_vad_16k_sequence.zero_state.onnx``: the same graph and weights, with ``h`` and
``c`` turned into zero initializers, which is the state the package (``sequence_vad.SileroVADSequence``)
starts every audio with. For audio of at most 512 frames (16.4 s), one call, it computes exactly what the
package computes. The frame axis is then the batch axis: a batch is one clip, frames in order.

Audio: synthetic, 16 kHz, seeded. Each clip is 64 frames (2.05 s): voiced syllables from additive harmonic
synthesis (a pitch contour around a speaker's f0, spectral tilt, three vowel formants that move from syllable
to syllable), short fricative noise bursts, pauses, and sometimes a hum or a chord instead of a voice; then
white, pink or brown noise at an SNR from clean to 0 dB. Calibration and evaluation use different seeds and
different speaker f0 ranges. Frames are cut as the package does: 512 samples, each prefixed with the last 64
samples of the previous frame (zeros for the first).

Metric ``decision_agreement``: 100 × the fraction of frames whose speech decision (probability ≥ 0.5, the
package's default threshold) equals the FP32 model's. It reads the first output, ``speech_probs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dopt_common.siblings import sibling

RATE, FRAME, CONTEXT, FRAMES = 16000, 512, 64, 64
CLIPS = 8  # per split: 8 × 64 = 512 frames, deploy_opt's default calibration sample count
THRESHOLD = 0.5
VARIANT = "silero_vad_16k_sequence.zero_state.onnx"
# (F1, F2, F3) in Hz of a, e, i, o, u
VOWELS = ((730, 1090, 2440), (530, 1840, 2480), (270, 2290, 3010), (570, 840, 2410), (300, 870, 2240))
Item = tuple[dict[str, np.ndarray], None, list[str]]


def prepare(cache: Path | None = None) -> Path:
    """Copy the packaged file and write its zero-state variant (``VARIANT``) into ``cache``; return the variant."""
    return sibling(__file__, "packages").prepare_variant("vad", VARIANT, _zero_state, cache)


def _zero_state(model: Any) -> Any:
    """The LSTM's state inputs ``h`` and ``c`` as zero initializers (each clip starts from silence)."""
    from onnx import numpy_helper

    for name in ("h", "c"):
        model.graph.input.remove(next(i for i in model.graph.input if i.name == name))
        model.graph.initializer.append(numpy_helper.from_array(np.zeros((1, 1, 128), np.float32), name))
    return model


def decision_agreement(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per frame: 100 where the speech decision (p ≥ 0.5) equals the FP32 model's, else 0."""
    return 100.0 * ((prediction.reshape(-1) >= THRESHOLD) == (reference.reshape(-1) >= THRESHOLD))


def _envelope(frequencies: np.ndarray, formants: np.ndarray) -> np.ndarray:
    """Amplitude of a vowel's spectral envelope at ``frequencies`` [K, T] for formants [3, T]."""
    out = np.zeros_like(frequencies)
    for formant, bandwidth in zip(formants, (80.0, 100.0, 140.0), strict=True):
        out += 1.0 / np.sqrt(1.0 + ((frequencies - formant) / bandwidth) ** 2)
    return out


def _voice(rng: np.random.Generator, length: int, f0: float) -> np.ndarray:
    """A run of voiced syllables with pauses and fricatives, ``length`` samples, peak about 1."""
    signal = np.zeros(length, dtype=np.float64)
    start = int(rng.integers(0, RATE // 4))
    while start < length - RATE // 10:
        n = int(rng.integers(RATE * 12 // 100, RATE * 35 // 100))
        stop = min(length, start + n)
        t = np.arange(stop - start) / RATE
        contour = f0 * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(1, 4) * t + rng.uniform(0, 6)) - 0.1 * t)
        phase = 2 * np.pi * np.cumsum(contour) / RATE
        a, b = (np.asarray(VOWELS[int(rng.integers(5))], float) for _ in range(2))
        mix = np.linspace(0, 1, len(t))
        formants = (a[:, None] * (1 - mix) + b[:, None] * mix) * rng.uniform(0.9, 1.15)
        harmonics = np.arange(1, int(4000 / f0) + 1)[:, None]
        amplitude = _envelope(harmonics * contour[None], formants) / harmonics**0.6
        syllable = (amplitude * np.sin(harmonics * phase[None])).sum(axis=0)
        window = np.minimum(1, np.minimum(t, t[-1] - t) / 0.03)
        signal[start:stop] += syllable / max(np.abs(syllable).max(), 1e-9) * window
        if rng.random() < 0.4:  # a fricative: high-passed noise burst after the syllable
            burst = min(length, stop + RATE // 12) - stop
            noise = np.diff(rng.normal(size=burst + 1)) * 0.15
            signal[stop : stop + burst] += noise * np.hanning(burst)
        start = stop + int(rng.integers(RATE // 40, RATE // 6 if rng.random() < 0.8 else RATE // 2))
    return signal


def _distractor(rng: np.random.Generator, length: int) -> np.ndarray:
    """A non-speech sound: mains hum with harmonics, or a held three-note chord."""
    t = np.arange(length) / RATE
    if rng.random() < 0.5:
        base = rng.choice([50.0, 60.0])
        return sum(np.sin(2 * np.pi * base * k * t) / k for k in range(1, 8))
    root = rng.uniform(180, 400)
    return sum(np.sin(2 * np.pi * root * r * t) for r in (1.0, 1.26, 1.5)) / 3


def _noise(rng: np.random.Generator, length: int) -> np.ndarray:
    """White, pink or brown noise of unit RMS."""
    white = rng.normal(size=length)
    kind = int(rng.integers(3))
    if kind == 0:
        return white
    spectrum = np.fft.rfft(white)
    scale = np.maximum(np.fft.rfftfreq(length), 1.0 / length) ** (-0.5 * kind)
    coloured = np.fft.irfft(spectrum * scale, n=length)
    return coloured / coloured.std()


def clip(seed: int, f0_range: tuple[float, float]) -> np.ndarray:
    """One 64-frame clip, float32 in [-1, 1]: a voice (or a distractor) plus noise at a seeded SNR."""
    rng = np.random.default_rng(seed)
    length = FRAMES * FRAME
    kind = rng.random()
    clean = _voice(rng, length, rng.uniform(*f0_range)) if kind < 0.75 else _distractor(rng, length)
    clean = clean / max(np.abs(clean).max(), 1e-9) * rng.uniform(0.1, 0.7)
    snr_db = (np.inf, 20.0, 10.0, 5.0, 0.0)[int(rng.integers(5))]
    if np.isfinite(snr_db):
        rms = np.sqrt(np.mean(clean**2))
        clean = clean + _noise(rng, length) * rms / 10 ** (snr_db / 20)
    return np.clip(clean, -1, 1).astype(np.float32)


def frames(audio: np.ndarray) -> np.ndarray:
    """The package's framing: [n, 576], each 512-sample frame after the previous frame's last 64 samples."""
    count = -(-audio.size // FRAME)
    blocks = np.zeros((count, FRAME), dtype=np.float32)
    blocks.reshape(-1)[: audio.size] = audio
    context = np.zeros((count, CONTEXT), dtype=np.float32)
    context[1:] = blocks[:-1, -CONTEXT:]
    return np.concatenate([context, blocks], axis=1)


def _batches(first_seed: int, f0_range: tuple[float, float], prefix: str) -> list[Item]:
    out = []
    for number in range(CLIPS):
        x = frames(clip(first_seed + number, f0_range))
        out.append(({"input": x}, None, [f"{prefix}-{number}-frame-{i}" for i in range(len(x))]))
    return out


def calibration_data() -> list[Item]:
    """8 clips (seeds 100-107, f0 95-170 Hz), one clip of 64 frames per batch."""
    return _batches(100, (95.0, 170.0), "calibration-clip")


def evaluation_data() -> list[Item]:
    """8 clips (seeds 900-907, f0 120-260 Hz), one clip of 64 frames per batch."""
    return _batches(900, (120.0, 260.0), "evaluation-clip")


def test_data() -> list[Item]:
    """8 other clips (seeds 1900-1907, f0 100-240 Hz), never shown to a build."""
    return _batches(1900, (100.0, 240.0), "test-clip")


def main() -> None:
    """CLI: ``--prepare`` writes the zero-state variant; ``--check`` prints the FP32 speech share per clip."""
    helps = (f"write .cache/{VARIANT}", "FP32 speech frames per clip, both splits")
    splits = (calibration_data, evaluation_data)
    sibling(__file__, "cli").run_model_check(__doc__, helps, prepare, splits, _check)


def _check(session: Any, split: str, data: list[Item]) -> None:
    """Print the share of frames the FP32 model calls speech, per clip of ``split``."""
    shares = [float((session.run(None, inputs)[0] >= THRESHOLD).mean()) for inputs, _, _ in data]
    print(f"vad {split}: speech share per clip {[round(s, 2) for s in shares]}")


if __name__ == "__main__":
    main()
