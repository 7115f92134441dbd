import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketsearch.index.codes import (as_words, pack_bits, pack_bytes, pack_hex, pack_ints, to_hex,
                                      to_ints, to_packed, unpack_words)

BITS = [1, 7, 8, 13, 31, 32, 63, 64, 65, 100, 128, 256]


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from(BITS), n=st.integers(0, 20), seed=st.integers(0, 2**32 - 1))
def test_all_formats_agree(bits, n, seed):
    b = np.random.default_rng(seed).integers(0, 2, (n, bits)).astype(np.uint8)
    words = pack_bits(b) if n else as_words(b.reshape(0, bits))
    assert words.shape == (n, (bits + 63) // 64)
    assert (unpack_words(words, bits) == b).all()
    assert (pack_bytes(np.packbits(b, axis=1), bits) == words).all()
    assert (to_packed(words, bits) == np.packbits(b, axis=1)).all()
    assert (pack_bits(2 * b.astype(np.int8) - 1) == words).all()
    assert (pack_bits(b.astype(bool)) == words).all()
    if n:
        assert (pack_hex(to_hex(words, bits), bits) == words).all()
        assert (pack_ints(to_ints(words, bits), bits) == words).all()
        assert to_ints(words, bits)[0] == int("".join(map(str, b[0])), 2)
        assert to_hex(words, bits)[0] == np.packbits(b[0]).tobytes().hex()


def test_single_word_is_the_code_value():
    words = pack_bits([[1, 0, 1, 1]])
    assert words[0, 0] == 0b1011


@pytest.mark.parametrize("call, message", [
    (lambda: pack_bits([[0, 1, 2]]), "row 0 column 2: value 2"),
    (lambda: pack_bits([[1, -1], [0, 1]]), "row 1 column 0: value 0 is outside the alphabet {-1, +1}"),
    (lambda: pack_bits(np.zeros((2, 1025), np.uint8)), "bits must be in [1, 1024], got 1025"),
    (lambda: pack_bits(np.zeros((2, 3, 4), np.uint8)), "2-D"),
    (lambda: pack_bits(np.zeros((2, 3)), ), "integer or bool dtype"),
    (lambda: pack_hex(["ab", "zz"], 8), "code 1: 'zz' is not a hex string"),
    (lambda: pack_hex(["abc"], 8), "code 0: 'abc' has 3 hex digits, a 8-bit code needs exactly 2"),
    (lambda: pack_hex(["ff"], 7), "nonzero padding bits"),
    (lambda: pack_ints([0, 256], 8), "code 1: 256 is outside [0, 2^8)"),
    (lambda: pack_bytes(np.zeros((2, 3), np.uint8), 16), "must have shape (n, 2)"),
    (lambda: as_words(np.array([[1 << 40]], np.uint64), 32), "bits set above bit 31"),
])
def test_bad_input_names_row_and_value(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)
