"""Creation, conversion, dtypes (incl. bf16/f16 bit-exact round trips) and Candle-style printing."""
from __future__ import annotations

import numpy as np
import pytest

import candle_web
from candle_web import Device, Tensor, bf16, f16, f32, f64, i64, u8, u32
from candle_web.core.dtype import ALL, f32_to_bf16_bits

TORCH_DTYPE_NAMES = {"u8": "uint8", "u32": "uint32", "i64": "int64", "f16": "float16",
                     "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


def test_new_from_nested_lists_and_scalars(device):
    t = Tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    assert t.dtype is f32 and t.shape == (2, 2) and t.to_list() == [[1, 2], [3, 4]]
    assert Tensor([[1, 2, 3]], device=device).dtype is i64
    assert Tensor([True, False], device=device).dtype is u8
    assert Tensor.new([1, 2], device, u32).dtype is u32
    scalar = Tensor(3.5, device=device)
    assert scalar.shape == () and scalar.rank == 0 and scalar.to_scalar() == 3.5
    assert scalar.to_numpy().shape == ()  # rank 0 stays rank 0 on the way out
    assert Tensor(7, dtype=bf16).shape == () and Tensor(7, dtype=bf16).to_scalar() == 7.0
    assert Tensor(np.float64(2.0)).dtype is f64  # numpy values keep their dtype


def test_from_numpy_accepts_any_real_dtype_with_explicit_target(device):
    ints = np.array([-2, 0, 3], dtype=np.int32)
    assert Tensor.from_numpy(ints, dtype=i64, device=device).to_list() == [-2, 0, 3]
    assert Tensor.from_numpy(np.array([1, 2], dtype=np.int8), dtype=f32).to_list() == [1.0, 2.0]
    bits = f32_to_bf16_bits(np.array([1.5, -2.0], dtype=np.float32))
    assert Tensor.from_numpy(bits, dtype=bf16).to_list() == [1.5, -2.0]  # uint16 = raw bits
    # Zero copy when the array is already in storage format.
    arr = np.arange(6, dtype=np.float32)
    assert np.shares_memory(Tensor.from_numpy(arr)._data, arr)


def test_zeros_ones_full_like(device):
    for dtype in ALL:
        z = Tensor.zeros((2, 3), dtype, device)
        o = Tensor.ones((2, 3), dtype, device)
        assert z.dtype is dtype and z.shape == (2, 3)
        assert z.to_numpy().tolist() == [[0] * 3] * 2 and o.to_numpy().tolist() == [[1] * 3] * 2
        assert o.zeros_like().to_list() == z.to_list() and z.ones_like().to_list() == o.to_list()
    f = Tensor.full(2.5, (2, 2), bf16, device)
    assert f.to_list() == [[2.5, 2.5], [2.5, 2.5]] and f.dtype is bf16
    assert f.full_like(-1.0).to_list() == [[-1.0, -1.0], [-1.0, -1.0]]
    assert Tensor.zeros((), f32, device).shape == ()


def test_arange_and_arange_step(device, torch):
    assert Tensor.arange(0, 5, device=device).to_list() == [0, 1, 2, 3, 4]
    assert Tensor.arange(0, 5, device=device).dtype is i64
    np.testing.assert_allclose(Tensor.arange_step(0.0, 1.0, 0.25, device=device).to_numpy(),
                               torch.arange(0.0, 1.0, 0.25).numpy())
    assert Tensor.arange_step(5, -1, -2, device=device).to_list() == [5, 3, 1]
    assert Tensor.arange(0, 4, dtype=bf16, device=device).to_list() == [0.0, 1.0, 2.0, 3.0]
    assert Tensor.arange(0, 4, dtype=f16, device=device).dtype is f16


def test_eye_tril2_triu2(device, torch):
    np.testing.assert_array_equal(Tensor.eye(4, device=device).to_numpy(), torch.eye(4).numpy())
    np.testing.assert_array_equal(Tensor.tril2(4, device=device).to_numpy(), torch.ones(4, 4).tril().numpy())
    np.testing.assert_array_equal(Tensor.triu2(4, device=device).to_numpy(), torch.ones(4, 4).triu().numpy())
    assert Tensor.tril2(3, u8, device).dtype is u8


def test_rand_randn_are_seeded_and_have_the_right_moments(device):
    candle_web.manual_seed(42, device)
    first = Tensor.randn(1.0, 2.0, (200, 100), device=device).to_numpy()
    uniform_first = Tensor.rand(-1.0, 3.0, (200, 100), device=device).to_numpy()
    candle_web.manual_seed(42, device)
    np.testing.assert_array_equal(Tensor.randn(1.0, 2.0, (200, 100), device=device).to_numpy(), first)
    np.testing.assert_array_equal(Tensor.rand(-1.0, 3.0, (200, 100), device=device).to_numpy(), uniform_first)
    # 20000 samples: standard error of the mean 2/sqrt(20000) ~ 0.014; 5 sigma bounds.
    assert abs(first.mean() - 1.0) < 0.07 and abs(first.std() - 2.0) < 0.05
    assert uniform_first.min() >= -1.0 and uniform_first.max() < 3.0 and abs(uniform_first.mean() - 1.0) < 0.06
    generator = np.random.default_rng(7)
    explicit = Tensor.randn(0.0, 1.0, (5,), dtype=f64, device=device, generator=generator)
    np.testing.assert_array_equal(explicit.to_numpy(), np.random.default_rng(7).normal(0.0, 1.0, 5))
    assert Tensor.rand(0.0, 1.0, (3,), dtype=bf16, device=device).dtype is bf16


def test_to_numpy_to_list_to_scalar_to_device(device):
    t = Tensor([[1.5, 2.5]], device=device)
    assert isinstance(t.to_numpy(), np.ndarray) and t.to_numpy().dtype == np.float32
    assert t.to_list() == [[1.5, 2.5]]
    assert t.sum_all().to_scalar() == 4.0
    assert float(t.sum_all()) == 4.0 and int(Tensor(3)) == 3
    assert t.to_device("cpu") is t and t.to_device(Device.cpu()) is t
    assert Tensor.from_numpy(np.array([1, 2], dtype=np.uint16), dtype=bf16).to_numpy().dtype == np.float32
    assert np.asarray(t).shape == (1, 2)


# Values exactly representable in every dtype (0..200 fit u8 and f16 and bf16 exactly).
REPRESENTABLE = np.array([0, 1, 2, 7, 64, 100, 200], dtype=np.float64)


@pytest.mark.parametrize("source", ALL, ids=str)
@pytest.mark.parametrize("target", ALL, ids=str)
def test_to_dtype_between_all_dtypes(source, target, device, torch):
    t = Tensor.from_numpy(REPRESENTABLE, dtype=source, device=device)
    converted = t.to_dtype(target)
    assert converted.dtype is target
    np.testing.assert_array_equal(converted.to_numpy().astype(np.float64), REPRESENTABLE)
    torch_source = torch.from_numpy(REPRESENTABLE).to(getattr(torch, TORCH_DTYPE_NAMES[source.name]))
    torch_target = torch_source.to(getattr(torch, TORCH_DTYPE_NAMES[target.name]))
    np.testing.assert_array_equal(converted.to_numpy().astype(np.float64),
                                  torch_target.double().numpy())


def test_float_to_int_truncates_toward_zero_and_saturates_like_candle(device):
    # Rust's `as`: truncation, saturation at the range, NaN -> 0 (numpy's astype is
    # platform-defined out of range, so the browser and native could disagree).
    x = Tensor.from_numpy(np.array([-1.7, 1.7, 300.0, -300.0, np.nan, np.inf, -np.inf, 5e9],
                                   dtype=np.float32), device=device)
    assert x.to_dtype(u8).to_list() == [0, 1, 255, 0, 0, 255, 0, 255]
    assert x.to_dtype(u32).to_list() == [0, 1, 300, 0, 0, 2 ** 32 - 1, 0, 2 ** 32 - 1]
    assert x.to_dtype(i64).to_list() == [-1, 1, 300, -300, 0, 2 ** 63 - 1, -2 ** 63, 5000000000]
    assert Tensor.from_numpy(np.array([-1.5, 256.0]), dtype=u8).to_list() == [0, 255]


def _bf16_edge_values() -> np.ndarray:
    bits = np.array([
        0x00000000, 0x80000000,  # +-0
        0x7F800000, 0xFF800000,  # +-inf
        0x00000001, 0x807FFFFF, 0x00400000, 0x00018000,  # f32 subnormals
        0x3F808000, 0x3F818000,  # ties: even stays, odd rounds up
        0x3F808001, 0x3F817FFF,  # just above / below a tie
        0x7F7FFFFF,  # largest finite f32: rounds up to inf
        0x7F7F7FFF, 0x00800000, 0x80800000,  # largest that stays finite, smallest normals
    ], dtype=np.uint32)
    return bits.view(np.float32)


def test_bf16_rounding_matches_torch_bit_for_bit(device, rng, torch):
    random_values = (rng.normal(size=4000) * np.exp(rng.uniform(-80, 80, 4000))).astype(np.float32)
    random_bits = rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([_bf16_edge_values(), random_values, random_bits])
    finite_or_inf = ~np.isnan(values)
    ours = Tensor.from_numpy(values, dtype=bf16, device=device).storage_numpy()
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours[finite_or_inf], theirs[finite_or_inf])
    # Through to_dtype as well (the device path, not only construction).
    via_to_dtype = Tensor.from_numpy(values, device=device).to_dtype(bf16).storage_numpy()
    np.testing.assert_array_equal(via_to_dtype, ours)
    # NaN stays NaN. Bits: torch writes 0xFFFF for every NaN; Candle (the `half` crate) keeps
    # sign and payload and sets the quiet bit, which is what we do.
    nan_bits = values[~finite_or_inf].view(np.uint32)
    assert np.all(np.isnan(Tensor.from_numpy(ours[~finite_or_inf], dtype=bf16).to_numpy()))
    np.testing.assert_array_equal(ours[~finite_or_inf], ((nan_bits >> 16) | 0x40).astype(np.uint16))


def test_bf16_and_f16_round_trips(device, rng, torch):
    values = np.concatenate([_bf16_edge_values(), rng.normal(size=500).astype(np.float32)])
    for dtype, torch_dtype in ((bf16, torch.bfloat16), (f16, torch.float16)):
        half = Tensor.from_numpy(values, device=device).to_dtype(dtype)
        expected = torch.from_numpy(values).to(torch_dtype).float().numpy()
        np.testing.assert_array_equal(half.to_numpy(), expected)
        np.testing.assert_array_equal(half.to_dtype(f32).to_numpy(), expected)
        # Half -> f32 -> half is the identity (widening is exact).
        np.testing.assert_array_equal(half.to_dtype(f32).to_dtype(dtype).storage_numpy(), half.storage_numpy())
    # bf16 <-> f16 directly, against torch.
    x = Tensor.from_numpy(rng.normal(size=64).astype(np.float32), dtype=bf16, device=device)
    np.testing.assert_array_equal(
        x.to_dtype(f16).to_numpy(),
        torch.from_numpy(x.to_numpy()).to(torch.bfloat16).to(torch.float16).float().numpy())


# Expected strings follow Candle's own display tests (candle-core/tests/display_tests.rs).
def test_printing_like_candle(device):
    assert str(Tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], device=device)) == \
        "[[0., 1., 2.],\n [3., 4., 5.]]\nTensor[[2, 3], f32]"
    assert str(Tensor(1234, dtype=u32, device=device)) == "[1234]\nTensor[[], u32]"
    minus = Tensor(-1234.0, device=device)
    assert str(minus / 10.0) == "[-123.4000]\nTensor[[], f32]"
    assert str(minus / 1e8) == "[-1.2340e-5]\nTensor[[], f32]"
    assert str(minus * 1e8) == "[-1.2340e11]\nTensor[[], f32]"
    assert str(minus * 0.0) == "[0.]\nTensor[[], f32]"
    assert str(Tensor.from_numpy(np.zeros(0, dtype=np.uint32))) == "[]\nTensor[[0], u32]"
    assert str(Tensor.from_numpy(np.array([0.1234567, 1.0, -1.2, 4.1, np.nan]), device=device)) == \
        "[ 0.1235,  1.0000, -1.2000,  4.1000,     NaN]\nTensor[[5], f64]"
    line = ", ".join(["42."] * 16)
    fifty = Tensor.ones(50, f32, device) * 42.0
    assert str(fifty) == (f"[{line},\n {line},\n {line},\n 42., 42.]\nTensor[[50], f32]")
    assert str(Tensor.ones(11000, f32, device) * 42.0) == \
        "[42., 42., 42., ..., 42., 42., 42.]\nTensor[[11000], f32]"
    row = "[42., 42., 42., ..., 42., 42., 42.]"
    big = Tensor.ones((200, 100), f32, device) * 42.0
    assert str(big) == ("[" + ",\n ".join([row] * 3) + ",\n ...\n " + ",\n ".join([row] * 3)
                        + "]\nTensor[[200, 100], f32]")
    assert repr(Tensor([[1, 20], [3, 4]], dtype=u8)) == "[[ 1, 20],\n [ 3,  4]]\nTensor[[2, 2], u8]"
    assert str(Tensor([1.5, -2.25], dtype=bf16)).endswith("Tensor[[2], bf16]")
