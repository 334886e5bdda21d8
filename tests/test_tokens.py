"""tokens family: sample_tokens, embedding, append_tokens (kernels_cu/tokens.cu).

CPU: Philox4x32-10 against Random123's known answers, the Gumbel noise's law, the
references' tie, NaN and range rules, scalar checks. GPU (marked): token ids equal to
the reference's exactly (greedy and seeded draws), draw frequencies against softmax,
tiny temperatures, embedding and append_tokens against the reference, a sampling step
replayed in a captured graph.
"""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, reference
from cupykern.ops import tokens
from tests.helpers import DTYPE_IDS, DTYPES, as_fake, assert_close, random_device


# ----------------------------------------------------------------- CPU
@pytest.mark.parametrize("counter, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_matches_random123_known_answers(counter, key, expected):
    """Random123's kat_vectors for philox4x32_10."""
    assert tuple(int(w) for w in reference.philox4x32_10(np.array(counter, np.uint64), key)) == expected


@pytest.mark.parametrize("counter, key, name", [
    ((2**32, 0, 0, 0), (0, 0), "counter"), ((0, 0, 0, -1), (0, 0), "counter"), ((0.5, 0, 0, 0), (0, 0), "counter"),
    ((0, 0, 0, 0), (2**40, 0), "key"), ((0, 0, 0, 0), (-1, 0), "key"),
    ((0, 0, 0, 0), (np.uint64(2**63), 0), "key"),
])
def test_philox_refuses_words_past_32_bits(counter, key, name):
    """Helper 71: a word past 32 bits ran (the rounds mixed its high bits) and returned
    words no 32-bit generator gives."""
    with pytest.raises(ValueError, match=rf"{name}: expected integer words in \[0, 2\*\*32\)"):
        reference.philox4x32_10(counter, key)


@pytest.mark.parametrize("counter, key, match", [((0, 0, 0), (0, 0), r"counter: expected shape \(\.\.\., 4\)"),
                                                 ((0, 0, 0, 0), (0, 0, 0), r"key: expected two words")])
def test_philox_refuses_other_shapes(counter, key, match):
    with pytest.raises(ValueError, match=match):
        reference.philox4x32_10(counter, key)


def test_gumbel_noise_has_the_gumbel_mean_and_variance():
    from cupykern.reference.tokens import gumbel_noise

    g = gumbel_noise(200_000, counter=3, seed=12345)
    assert abs(g.mean() - np.euler_gamma) < 0.01
    assert abs(g.var() - np.pi**2 / 6) < 0.03


def test_reference_greedy_takes_the_first_maximum_and_reports_nonfinite_rows():
    logits = np.array([[1.0, 3.0, 3.0, -1.0], [1.0, np.nan, 3.0, np.inf], [0.0, 0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_array_equal(reference.sample_tokens(logits), [1, -2, 0])


def test_reference_draws_depend_on_seed_and_position_only():
    from cupykern.reference.tokens import gumbel_noise

    logits = np.zeros((1, 1000), np.float32)
    a = reference.sample_tokens(logits, temperature=1.0, seed=7, positions=np.array([5]))
    assert a[0] == int(np.argmax(gumbel_noise(1000, 5, 7)))
    assert a[0] == reference.sample_tokens(logits, temperature=1.0, seed=7, positions=np.array([5]))[0]


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), 1e31, 1e-39, 5e-324])
def test_temperature_outside_the_range_is_refused(value):
    """Negative, not finite, too large, or subnormal in float32 (the kernel would flush it)."""
    with pytest.raises(ValueError, match="temperature"):
        tokens.temperature(value)


def test_the_smallest_normal_temperature_is_accepted():
    assert tokens.temperature(1.2e-38) > 0 and tokens.temperature(0) == 0


@pytest.mark.parametrize("value", [-1, 2**64, 1.5, True, "1"])
def test_bad_seeds_are_refused(value):
    with pytest.raises(ValueError, match="seed"):
        tokens.seed(value)


@pytest.mark.parametrize("value", [1.0, True, np.float64(1.0)])
def test_a_seed_equal_to_an_accepted_one_is_still_refused(fake_launcher, value):
    """The launcher keys calls by scalars compared with ==: a float or bool seed equal to
    an int seed already used found that call's recipe and passed unchecked."""
    logits = as_fake(np.zeros((1, 10), np.float32))
    cupykern.sample_tokens(logits, temperature=1.0, seed=1)
    with pytest.raises(ValueError, match="seed: expected an int"):
        cupykern.sample_tokens(logits, temperature=1.0, seed=value)
    cupykern.sample_tokens(logits, temperature=1.0, seed=np.uint64(1))


def test_seed_splits_into_philox_key_words():
    assert tokens.seed(2**40 + 7) == (7, 2**8)


def test_reference_embedding_writes_nan_rows_for_ids_outside_the_table():
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    rows = reference.embedding(np.array([2, 3, -1]), table, check_ids=False)
    np.testing.assert_array_equal(rows[0], [4, 5])
    assert np.isnan(rows[1:]).all()
    assert np.isnan(reference.embedding(np.array([0]), np.zeros((0, 2), np.float32), check_ids=False)).all()


def test_reference_embedding_checks_ids_as_the_kernel():
    """check_ids (the default) refuses an id outside the table with the kernel's message;
    the flag is checked as a bool."""
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    with pytest.raises(ValueError, match=r"token_ids: expected values in \[0, 3\) \(the rows of weight\), got min -1, max 3"):
        reference.embedding(np.array([2, 3, -1]), table)
    with pytest.raises(ValueError, match=r"token_ids: expected values in \[0, 0\)"):
        reference.embedding(np.array([0]), np.zeros((0, 2), np.float32))
    with pytest.raises(TypeError, match="check_ids: expected a bool"):
        reference.embedding(np.array([0]), table, check_ids="yes")
    # float64 ids are named as the kernel names them (the references check a float64
    # array as float32, the kernels' compute type: helper 61 read "got float32")
    with pytest.raises(TypeError, match=r"token_ids: expected dtype int32 or int64, got float64$"):
        reference.embedding(np.array([0.0]), table)


def test_reference_sample_tokens_takes_a_temperature_as_the_kernel():
    """A complex temperature with no imaginary part passes the kernel's check (_arrays.real)."""
    logits = np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32)
    np.testing.assert_array_equal(reference.sample_tokens(logits, temperature=0.7 + 0j, seed=3),
                                  reference.sample_tokens(logits, temperature=0.7, seed=3))


def test_reference_append_tokens_advances_and_records():
    positions, history = reference.append_tokens(np.array([7, 9], np.int32), np.array([0, 3], np.int32),
                                                 np.zeros((2, 4), np.int32))
    np.testing.assert_array_equal(positions, [1, 4])
    np.testing.assert_array_equal(history, [[0, 7, 0, 0], [0, 0, 0, 0]])  # position 4 is past the end


def test_reference_append_tokens_wraps_positions_as_int32():
    """The kernel's positions are int32: the largest one advances to -2**31 (recorded
    nowhere), not to 2**31."""
    positions, history = reference.append_tokens(np.array([7], np.int32), np.array([2**31 - 1], np.int32),
                                                 np.zeros((1, 4), np.int32))
    np.testing.assert_array_equal(positions, [-2**31])
    assert not history.any()


# ----------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [1, 7, 1000, 49152, 128256])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.2e-38, 1e4])
def test_sample_tokens_equal_the_reference(rng, vocab, temperature):
    logits = cupy.asarray((rng.standard_normal((6, vocab)) * 3).astype(np.float32))
    logits[1, vocab // 2] = logits[1].max() + 1  # a clear winner
    logits[2, :] = 0.5  # all tied: the first index when greedy
    positions = cupy.asarray(rng.integers(0, 2**31 - 1, 6, dtype=np.int64))
    seed = int(rng.integers(0, 2**64, dtype=np.uint64))
    got = cupykern.sample_tokens(logits, temperature=temperature, seed=seed, positions=positions)
    want = reference.sample_tokens(logits, temperature=temperature, seed=seed, positions=positions)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.get(), want)
    if temperature in (0.0, 1.2e-38):  # the noise times a tiny temperature vanishes in float32
        np.testing.assert_array_equal(got.get(), np.argmax(logits.get(), axis=1))


@pytest.mark.gpu
def test_sample_tokens_reports_nonfinite_logits(rng):
    logits = cupy.asarray(rng.standard_normal((3, 5000)).astype(np.float32))
    logits[0, 17] = np.nan
    logits[1, [3, 4, 4999]] = np.inf
    got = cupykern.sample_tokens(logits, temperature=0.5).get()
    assert got[0] == -1 and got[1] == -3 and got[2] >= 0


@pytest.mark.gpu
def test_draw_frequencies_follow_softmax(rng):
    """8192 positions of one 4-logit row: each frequency within 5 sigma of softmax."""
    row = np.array([0.0, 1.0, 2.0, -1.0], np.float32)
    n = 8192
    logits = cupy.asarray(np.tile(row, (n, 1)))
    draws = cupykern.sample_tokens(logits, temperature=1.0, seed=99, positions=cupy.arange(n, dtype=np.int32)).get()
    p = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    freq = np.bincount(draws, minlength=4) / n
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n)), (freq, p)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hidden", [576, 4096, 33])
def test_embedding_against_float64(rng, dtype, hidden):
    weight = random_device(rng, (500, hidden), dtype)
    ids = cupy.asarray(rng.integers(0, 500, 9).astype(np.int32))
    out = cupy.full((9, hidden), np.nan, dtype)
    cupykern.embedding(ids, weight, out=out)
    assert_close(out, reference.embedding(ids, weight), dtype, seed=rng.seed, rtol=0, atol=0.5 * 2.0**-149)
    with pytest.raises(ValueError, match=r"token_ids: expected values in \[0, 500\)"):
        cupykern.embedding(cupy.asarray([0, 500], np.int32), weight)
    unchecked = cupykern.embedding(cupy.asarray([0, 500], np.int32), weight, check_ids=False)
    assert cupy.isnan(unchecked[1].astype(np.float32)).all() and not cupy.isnan(unchecked[0].astype(np.float32)).any()


@pytest.mark.gpu
def test_append_tokens_against_the_reference(rng):
    toks = cupy.asarray(rng.integers(0, 1000, 300).astype(np.int32))
    positions = cupy.asarray(rng.integers(-2, 64, 300).astype(np.int32))
    history = cupy.asarray(rng.integers(0, 1000, (300, 64)).astype(np.int32))
    want = reference.append_tokens(toks, positions, history)
    cupykern.append_tokens(toks, positions, history)
    np.testing.assert_array_equal(positions.get(), want[0])
    np.testing.assert_array_equal(history.get(), want[1])


@pytest.mark.gpu
def test_append_tokens_wraps_the_largest_position_as_the_reference(rng):
    """positions[b] + 1 at INT32_MAX was a signed overflow in the kernel (undefined)."""
    toks = cupy.asarray([5, 6], np.int32)
    positions = cupy.asarray([2**31 - 1, 1], np.int32)
    history = cupy.zeros((2, 4), np.int32)
    want = reference.append_tokens(toks, positions, history)
    cupykern.append_tokens(toks, positions, history)
    np.testing.assert_array_equal(positions.get(), want[0])
    np.testing.assert_array_equal(history.get(), want[1])


@pytest.mark.gpu
def test_sampling_step_replays_in_a_graph(rng):
    """embedding -> (stand-in logits) -> sample_tokens -> append_tokens, captured once and
    replayed: each replay draws at the advanced position, as eager calls do."""
    vocab = 300
    weight = random_device(rng, (vocab, vocab), _dtypes.float32)

    def run(capture):
        positions = cupy.asarray([4], np.int32)
        token = cupy.asarray([5], np.int32)
        history = cupy.zeros((1, 32), np.int32)
        hidden = cupy.empty((1, vocab), np.float32)

        def step():
            cupykern.embedding(token, weight, out=hidden, check_ids=False)
            cupykern.sample_tokens(hidden, temperature=0.8, seed=3, positions=positions, out=token)
            cupykern.append_tokens(token, positions, history)

        cupy.cuda.Device().synchronize()  # the default stream's writes, which a non-blocking stream does not wait for
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            if capture:
                step()
                positions[...] = 4
                token[...] = 5
                history[...] = 0
                stream.begin_capture()
                step()
                graph = stream.end_capture()
            for _ in range(10):
                graph.launch(stream=stream) if capture else step()
            stream.synchronize()
        return history.get(), positions.get()

    eager, graphed = run(False), run(True)
    np.testing.assert_array_equal(eager[0], graphed[0])
    assert eager[1][0] == graphed[1][0] == 14 and (eager[0][0, 5:15] >= 0).all()


def test_references_chain_as_the_ops_do_in_int32():
    """sample_tokens' reference gives int32 ids, which append_tokens' reference takes as
    they are, and its results are int32 too (the ops' dtypes)."""
    logits = np.array([[0.0, 2.0, 1.0]], np.float32)
    token = reference.sample_tokens(logits)
    assert token.dtype == np.int32 and token.tolist() == [1]
    positions, history = reference.append_tokens(token, np.array([0], np.int32), np.zeros((1, 4), np.int32))
    assert positions.dtype == history.dtype == np.int32
    assert reference.append_tokens(token, positions, history)[1].tolist() == [[0, 1, 1, 0]]
