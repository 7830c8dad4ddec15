"""The native audio pipeline, each step against a reference computed another way.

References: WAV files written with Python's ``wave`` module (int16, so the
decoded floats are exactly value / 32768); sines evaluated analytically;
``torch.stft`` and numpy's FFT for the spectrogram; torchaudio's
``melscale_fbanks`` formulas re-written in numpy (float64) for the filters.
Tolerances: exact for lossless decoding and for the batch layout; 1e-4
relative (float32 FFT against float64) for spectra; 2e-3 absolute for
resampled sines away from the edges (soxr's HQ passband ripple).
"""

from __future__ import annotations

import json
import subprocess
import wave

import numpy as np
import pytest
import torch

from dlop import _C
from dlop.errors import SampleError

audio = _C.media.audio


def write_wav(path, samples: np.ndarray, rate: int) -> np.ndarray:
    """Writes int16 frames x channels; returns what a decoder must give back."""
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return pcm.astype(np.float32) / 32768


def sine(freq: float, rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    x = 0.5 * np.sin(2 * np.pi * freq * t)
    return np.stack([x * (0.5 + 0.5 * c) for c in range(channels)], axis=1)


def spec(**kw) -> str:
    return json.dumps({"seconds": 2, **kw})


def ffmpeg(*args):
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", *map(str, args)], check=True)


# ---- decoding ------------------------------------------------------------------

def test_wav_and_flac_decode_exactly(tmp_path):
    want = write_wav(tmp_path / "a.wav", sine(440, 22050, 0.7, channels=2), 22050)
    ffmpeg("-i", tmp_path / "a.wav", tmp_path / "a.flac")
    for name in ("a.wav", "a.flac"):
        got, rate = audio.decode((tmp_path / name).read_bytes())
        assert rate == 22050
        np.testing.assert_array_equal(got, want)


def test_time_span_decodes_only_its_part(tmp_path):
    want = write_wav(tmp_path / "a.wav", sine(100, 8000, 2.0), 8000)
    got, _ = audio.decode((tmp_path / "a.wav").read_bytes(), start=0.5, end=1.25)
    np.testing.assert_array_equal(got, want[4000:10000])


@pytest.mark.parametrize("ext,rate", [("opus", 48000), ("mp3", 22050), ("ogg", 16000)])
def test_lossy_formats_keep_the_tone(tmp_path, ext, rate):
    write_wav(tmp_path / "a.wav", sine(300, rate, 1.0), rate)
    ffmpeg("-i", tmp_path / "a.wav", tmp_path / f"a.{ext}")
    got, got_rate = audio.decode((tmp_path / f"a.{ext}").read_bytes())
    assert got_rate == rate
    assert abs(len(got) - rate) <= rate // 10  # codecs add priming or padding frames
    spectrum = np.abs(np.fft.rfft(got[:, 0]))
    assert abs(np.argmax(spectrum) * rate / len(got) - 300) < 3


@pytest.mark.parametrize("content,why", [(b"", "empty file"), (b"RIFF\x10\x00\x00\x00WAVEjunkjunk", "libsndfile")])
def test_bad_files_are_sample_errors_naming_the_file(content, why):
    with pytest.raises(SampleError, match=f"clip.wav.*{why}"):
        audio.decode(content, name="clip.wav")


def test_a_wav_with_no_frames_is_a_sample_error(tmp_path):
    write_wav(tmp_path / "z.wav", np.zeros((0, 1)), 16000)
    with pytest.raises(SampleError, match="z.wav.*no audio samples"):
        audio.decode((tmp_path / "z.wav").read_bytes(), name="z.wav")


# ---- resampling ----------------------------------------------------------------

@pytest.mark.parametrize("src,dst", [(44100, 16000), (8000, 16000), (48000, 22050), (16000, 16000)])
def test_resampled_sine_matches_the_sine_at_the_new_rate(src, dst):
    x = sine(440, src, 1.0)[:, 0].astype(np.float32)
    y = audio.resample(x, src, dst)
    assert abs(len(y) - dst) <= 1
    ref = sine(440, dst, 1.0)[: len(y), 0]
    middle = slice(dst // 10, len(y) - dst // 10)
    np.testing.assert_allclose(y[middle], ref[middle], atol=2e-3)


# ---- features ------------------------------------------------------------------

def hz_to_mel(f, scale):
    if scale == "htk":
        return 2595 * np.log10(1 + f / 700)
    f = np.asarray(f, dtype=np.float64)
    return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27), f * 3 / 200)


def mel_to_hz(m, scale):
    if scale == "htk":
        return 700 * (10 ** (m / 2595) - 1)
    return np.where(m >= 15, 1000 * np.exp(np.log(6.4) / 27 * (m - 15)), 200 * m / 3)


def reference_filters(rate, n_fft, n_mels, f_min, f_max, scale, norm):
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    f_pts = mel_to_hz(np.linspace(hz_to_mel(f_min, scale), hz_to_mel(f_max, scale), n_mels + 2), scale)
    diff = np.diff(f_pts)
    slopes = f_pts[None, :] - freqs[:, None]
    fb = np.maximum(0, np.minimum(-slopes[:, :-2] / diff[:-1], slopes[:, 2:] / diff[1:]))
    if norm:
        fb *= 2 / (f_pts[2:] - f_pts[:-2])
    return fb.T


@pytest.mark.parametrize("scale,norm,n_fft,n_mels,f_min,f_max", [
    ("htk", False, 400, 80, 0, 0), ("slaney", True, 512, 64, 20, 7600), ("slaney", False, 401, 40, 0, 4000),
])
def test_mel_filter_bank(scale, norm, n_fft, n_mels, f_min, f_max):
    s = spec(n_fft=n_fft, n_mels=n_mels, mel_scale=scale, slaney_norm=norm, f_min=f_min, f_max=f_max)
    got = audio.mel_filter_bank(s)
    want = reference_filters(16000, n_fft, n_mels, f_min, f_max or 8000, scale, norm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n_fft,hop,win", [(400, 160, 400), (512, 128, 320), (401, 100, 401), (64, 64, 64)])
@pytest.mark.parametrize("length", [1, 50, 16000, 16001])
def test_power_spectrogram_equals_torch_stft(n_fft, hop, win, length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal(length).astype(np.float32)
    got = audio.power_spectrogram(x, spec(n_fft=n_fft, hop=hop, win_length=win))
    if length > n_fft // 2:  # torch refuses reflect padding wider than the signal
        ref = torch.stft(torch.from_numpy(x).double(), n_fft, hop, win, torch.hann_window(win, dtype=torch.float64),
                         center=True, pad_mode="reflect", return_complex=True).abs().pow(2).T.numpy()
    else:
        padded = np.pad(x.astype(np.float64), n_fft // 2, mode="reflect")
        window = np.zeros(n_fft)
        window[(n_fft - win) // 2:(n_fft - win) // 2 + win] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)
        frames = 1 + (len(padded) - n_fft) // hop
        ref = np.stack([np.abs(np.fft.rfft(padded[t * hop:t * hop + n_fft] * window)) ** 2 for t in range(frames)])
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * ref.max())


def test_log_mel_and_normalisation():
    rng = np.random.default_rng(3)
    s = spec(n_fft=400, n_mels=40)
    power = rng.random((57, 201)).astype(np.float32)
    filters = audio.mel_filter_bank(s)
    want = np.log(filters.astype(np.float64) @ power.T.astype(np.float64) + 1e-6)
    want = (want - want.mean()) / (want.std() + 1e-5)
    np.testing.assert_allclose(audio.log_mel(power, filters, s), want, rtol=1e-4, atol=1e-4)
    plain = audio.log_mel(power, filters, spec(n_fft=400, n_mels=40, log=False, normalize=False))
    np.testing.assert_allclose(plain, filters.astype(np.float64) @ power.T, rtol=1e-5)


def test_spec_augment_masks_whole_bands_within_bounds():
    s = spec(n_mels=80, freq_masks=2, freq_mask_width=27, time_masks=2, time_mask_width=40)
    ones = np.ones((80, 201), dtype=np.float32)
    seen_masked = 0
    for index in range(50):
        got = audio.spec_augment(ones, s, seed=1, index=index)
        np.testing.assert_array_equal(got, audio.spec_augment(ones, s, seed=1, index=index))
        zero_rows = np.flatnonzero((got == 0).all(axis=1))
        zero_cols = np.flatnonzero((got == 0).all(axis=0))
        # Every zero lies in a masked row or column: masks are whole bands.
        rows, cols = np.nonzero(got == 0)
        assert np.all(np.isin(rows, zero_rows) | np.isin(cols, zero_cols))
        assert len(zero_rows) <= 2 * 27 and len(zero_cols) <= 2 * 40 or len(zero_rows) == 80
        seen_masked += len(zero_rows) > 0
    assert seen_masked > 40  # masks of width 0 are possible, but rare


@pytest.mark.parametrize("crop", ["start", "center"])
def test_features_of_a_stereo_file_equal_the_reference_pipeline(tmp_path, crop):
    """The pipeline decodes and resamples only the crop's part (with a margin); the reference resamples the
    whole file, then crops: equal within the tolerance only if the part's samples fall on the same instants."""
    raw = write_wav(tmp_path / "a.wav", sine(440, 22050, 3.0, channels=2) + 0.01, 22050)
    s = spec(seconds=2, crop=crop, n_fft=400, hop=160, n_mels=80, mel_scale="slaney", slaney_norm=True)
    got = audio.features((tmp_path / "a.wav").read_bytes(), s)
    mono = raw.mean(axis=1, dtype=np.float64).astype(np.float32)
    first = 0 if crop == "start" else (len(mono) * 16000 // 22050 - 32000) // 2
    signal = audio.resample(mono, 22050, 16000)[first:first + 32000]
    power = torch.stft(torch.from_numpy(signal).double(), 400, 160, 400, torch.hann_window(400, dtype=torch.float64),
                       center=True, pad_mode="reflect", return_complex=True).abs().pow(2).numpy()
    mel = np.log(reference_filters(16000, 400, 80, 0, 8000, "slaney", True) @ power + 1e-6)
    want = (mel - mel.mean()) / (mel.std() + 1e-5)
    assert got.shape == want.shape == (80, 201)
    np.testing.assert_allclose(got, want, atol=2e-3)


# ---- batches -------------------------------------------------------------------

def make_folder(root, seconds_by_class):
    expected = {}
    for c, durations in seconds_by_class.items():
        (root / c).mkdir(parents=True)
        for k, d in enumerate(durations):
            write_wav(root / c / f"{k}.wav", sine(200 + 100 * k, 16000, d), 16000)
            expected[f"{c}/{k}.wav"] = d
    return expected


def test_batches_pad_to_the_longest_crop_and_carry_lengths(tmp_path):
    make_folder(tmp_path, {"a": [0.5, 2.5], "b": [1.0, 0.01]})
    source = _C.media.open_source(str(tmp_path), kind="audio")
    maker = _C.media.BatchMaker(json.dumps({"kind": "audio", "seconds": 2, "hop": 160,
                                              "freq_masks": 1, "freq_mask_width": 10}))
    assert maker.layout(source) == {"shape": [80, 201], "dtype": "float32", "label_width": 1, "lengths": True}
    samples, labels, lengths, skipped = maker.run_batch(source, [0, 1, 2, 3], seed=5, epoch=1)
    assert skipped == [] and labels.tolist() == [0, 0, 1, 1]
    assert lengths.tolist() == [1 + 8000 // 160, 201, 1 + 16000 // 160, 2]
    for k, n in enumerate(lengths):
        assert not samples[k, :, n:].any()
        alone = audio.features(source.read(k), maker.spec, seed=5, epoch=1, index=k)
        np.testing.assert_array_equal(samples[k, :, :n], alone)
    again = maker.run_batch(source, [0, 1, 2, 3], seed=5, epoch=1, threads=3)
    np.testing.assert_array_equal(again[0], samples)
    other_epoch = maker.run_batch(source, [1], seed=5, epoch=2)[0]
    assert not np.array_equal(other_epoch[0], samples[1])  # the crop and masks are drawn per epoch


def test_a_multi_label_manifest_gives_multi_hot_labels_and_spans(tmp_path):
    make_folder(tmp_path / "clips", {"x": [1.0, 1.0]})
    (tmp_path / "m.csv").write_text("path,labels,start,end\nclips/x/0.wav,speech;music,0.25,0.75\n"
                                    "clips/x/1.wav,noise,,\n")
    source = _C.media.open_source(str(tmp_path / "m.csv"))
    assert source.classes == ["music", "noise", "speech"] and source.multi_label
    maker = _C.media.BatchMaker(json.dumps({"kind": "audio", "seconds": 1, "crop": "start"}))
    samples, labels, lengths, _ = maker.run_batch(source, [0, 1])
    assert labels.tolist() == [[1, 0, 1], [0, 1, 0]]
    assert lengths.tolist() == [1 + 8000 // 160, 1 + 16000 // 160]


def test_bad_samples_raise_or_are_skipped_as_the_spec_says(tmp_path):
    make_folder(tmp_path, {"a": [0.5, 0.5, 0.5]})
    (tmp_path / "a" / "1.wav").write_bytes(b"")
    (tmp_path / "a" / "2.wav").write_bytes((tmp_path / "a" / "0.wav").read_bytes()[:30])
    source = _C.media.open_source(str(tmp_path), kind="audio")
    raising = _C.media.BatchMaker(json.dumps({"kind": "audio", "seconds": 1}))
    with pytest.raises(SampleError, match=r"a/1\.wav.*empty file"):
        raising.run_batch(source, [0, 1, 2])
    skipping = _C.media.BatchMaker(json.dumps({"kind": "audio", "seconds": 1, "on_error": "skip"}))
    samples, labels, lengths, skipped = skipping.run_batch(source, [0, 1, 2])
    assert len(samples) == 1 and [i for i, _ in skipped] == [1, 2]
    assert "2.wav" in skipped[1][1]


@pytest.mark.parametrize("bad,field", [
    ({}, "seconds"), ({"seconds": 1, "n_fft": 400, "win_length": 512}, "win_length"),
    ({"seconds": 1, "f_max": 9000}, "f_max"), ({"seconds": 1, "mel_scale": "bark"}, "mel_scale"),
    ({"seconds": 1, "hopp": 10}, "hopp"),
])
def test_bad_specs_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        _C.media.BatchMaker(json.dumps({"kind": "audio", **bad}))


@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_a_truncated_file_is_a_sample_error(tmp_path, ext):
    write_wav(tmp_path / "a.wav", sine(440, 16000, 1.0), 16000)
    if ext != "wav":
        ffmpeg("-i", tmp_path / "a.wav", tmp_path / f"a.{ext}")
    data = (tmp_path / f"a.{ext}").read_bytes()
    with pytest.raises(SampleError, match=f"cut.{ext}"):
        audio.decode(data[: len(data) // 2], name=f"cut.{ext}")


def test_a_codec_libsndfile_lacks_is_a_sample_error(tmp_path):
    write_wav(tmp_path / "a.wav", sine(440, 16000, 0.5), 16000)
    ffmpeg("-i", tmp_path / "a.wav", "-c:a", "aac", tmp_path / "a.m4a")  # AAC: no libsndfile decoder
    with pytest.raises(SampleError, match="a.m4a.*not an audio file libsndfile reads"):
        audio.decode((tmp_path / "a.m4a").read_bytes(), name="a.m4a")


@pytest.mark.parametrize("rate", [44100, 22050, 8000, 16000])
@pytest.mark.parametrize("crop", ["start", "center", "random"])
def test_the_crop_equals_the_whole_file_resampled_then_cropped(tmp_path, rate, crop):
    """Only the crop's part is decoded and resampled: its samples must fall on the instants the whole file's
    resampling gives (a chirp, so a shift by a fraction of a sample shows), away from the file's own edges."""
    t = np.arange(int(rate * 3.3)) / rate
    write_wav(tmp_path / "a.wav", (0.5 * np.sin(2 * np.pi * (200 * t + 400 * t * t)))[:, None], rate)
    data = (tmp_path / "a.wav").read_bytes()
    whole = audio.resample(audio.decode(data)[0][:, 0].copy(), rate, 16000)
    length = int(rate * 3.3) * 16000 // rate
    s = spec(seconds=1, crop=crop)
    for index in range(3):
        got = audio.crop(data, s, seed=4, index=index)
        assert len(got) == 16000
        # Where the crop starts: the one offset whose whole-file samples equal these.
        starts = [c for c in range(length - 16000 + 1) if abs(whole[c + 8000] - got[8000]) < 1e-3
                  and np.abs(whole[c:c + 16000][2000:-2000] - got[2000:-2000]).max() < 1e-3]
        assert len(starts) == 1, starts[:5]
        if crop == "start":
            assert starts == [0]
        if crop == "center":
            assert starts == [(length - 16000) // 2]
