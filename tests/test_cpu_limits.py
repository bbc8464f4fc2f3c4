"""tests/cpu_limits.py reads the CPU's flags, not a substring of another flag."""

from cpu_limits import cpu_has_amx_tiles


def test_amx_tiles_are_read_from_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile avx_vnni\n")
    assert cpu_has_amx_tiles(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 avx_vnni\n")
    assert not cpu_has_amx_tiles(info)
    info.write_text("model name\t: amx_tile lookalike\nflags\t\t: fpu\n")
    assert not cpu_has_amx_tiles(info)
    assert not cpu_has_amx_tiles(tmp_path / "absent")
