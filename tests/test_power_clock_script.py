"""scripts/power_clock.py: what it reads from nvidia-smi and what it derives from it."""
from types import SimpleNamespace

import pytest
from script_support import load_script

power_clock = load_script("power_clock")


def test_samples_are_read_and_noise_lines_skipped():
    text = "1755, 699.12, 700.00\n[N/A], 12, 700\nNo devices were found\n1620, 701.5, 700.00\n\n"
    assert power_clock.parse_samples(text) == [(1755.0, 699.12, 700.0), (1620.0, 701.5, 700.0)]


def test_a_side_is_summarized_as_cycles_and_work_per_energy():
    samples = [(1600.0, 690.0, 700.0), (1610.0, 700.0, 700.0), (1620.0, 710.0, 700.0)]
    flops = 2.0 * 4096 * 8192 * 8192
    got = power_clock.side_summary(samples, us=700.0, flops=flops)
    assert got["mhz"] == 1610.0 and got["watts"] == 700.0 and got["limit_w"] == 700.0 and got["samples"] == 3
    assert got["mcycles"] == pytest.approx(700.0 * 1610.0 / 1e6)          # 1.127 M cycles per call
    assert got["tflops"] == pytest.approx(flops / 700e-6 / 1e12)            # 785 TFLOP/s
    assert got["tflops_per_kw"] == pytest.approx(got["tflops"] / 0.7)
    assert got["mj"] == pytest.approx(700.0 * 700e-6 * 1e3)                # 490 mJ per call


def test_no_samples_is_an_error_that_says_why():
    with pytest.raises(ValueError, match="no nvidia-smi samples"):
        power_clock.side_summary([], us=1.0, flops=1.0)


def test_the_device_is_named_by_its_pci_bus_id():
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0)
    assert power_clock.smi_device(props) == "00000000:1B:00.0"
