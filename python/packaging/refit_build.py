"""A PEP 517 build backend for `pip install .`: CMake builds the extension.

It needs nothing from PyPI (no setuptools, no scikit-build), so it works
offline: it configures the project in build/pip-<python tag> with this
interpreter, builds the refit_python target, and packs python/refit plus the
extension into a wheel. CMake, Ninja, a C++20 compiler, pybind11 and
refit's libraries (scripts/setup.sh) must be installed. Set CMAKE_ARGS to
pass more options to the configure step.
"""

import base64
import hashlib
import os
import pathlib
import shlex
import subprocess
import sys
import sysconfig
import zipfile

NAME = "refit"
VERSION = "0.1.0"
ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "refit"

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Keep RL rollout engines' weights in sync with the trainer by sending only the bits that changed
Requires-Python: >=3.9
Requires-Dist: numpy
Provides-Extra: torch
Requires-Dist: torch; extra == "torch"
"""


def _tag():
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = impl + getattr(sys, "abiflags", "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return impl, abi, plat


def _note(message):
    """Shows a stage of the build.

    pip captures a backend's output and shows it only with `pip install -v`,
    so a Release build of several minutes would look hung; each stage note
    therefore also goes straight to the terminal when there is one.
    """
    line = f"refit build: {message}\n"
    sys.stderr.write(line)
    sys.stderr.flush()
    if sys.stderr.isatty():
        return
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(line)
    except OSError:
        pass  # no terminal (CI): the captured output has the note


def _build_extension():
    impl, _, _ = _tag()
    build = ROOT / "build" / f"pip-{impl}"
    args = ["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_FLAGS=-O3 -march=x86-64-v2 -DNDEBUG",
            "-DREFIT_BUILD_TESTS=OFF", "-DREFIT_BUILD_BENCH=OFF", "-DREFIT_BUILD_PYTHON=ON",
            f"-DPython_EXECUTABLE={sys.executable}"]
    try:
        import pybind11  # a pip-installed pybind11, when the archive's is absent

        args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
    except ImportError:
        pass
    args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    _note(f"configuring with CMake in {build}")
    subprocess.run(args, check=True)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    _note(f"compiling the extension with {jobs} jobs; this takes minutes "
          "(`pip install -v .` shows every step)")
    subprocess.run(["cmake", "--build", str(build), "--target", "refit_python", "-j", jobs],
                   check=True)
    _note("packing the wheel")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    ext = build / "python" / "refit" / f"_native{suffix}"
    if not ext.exists():
        raise RuntimeError(f"the build did not produce {ext}")
    return ext


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    # Metadata without a build, so pip compiles once (in build_wheel).
    dist_info = pathlib.Path(metadata_directory) / f"{NAME}-{VERSION}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(METADATA)
    impl, abi, plat = _tag()
    (dist_info / "WHEEL").write_text(_wheel_text(f"{impl}-{abi}-{plat}"))
    return dist_info.name


def _wheel_text(tag):
    return f"Wheel-Version: 1.0\nGenerator: refit_build\nRoot-Is-Purelib: false\nTag: {tag}\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    ext = _build_extension()
    impl, abi, plat = _tag()
    tag = f"{impl}-{abi}-{plat}"
    dist_info = f"{NAME}-{VERSION}.dist-info"
    wheel_name = f"{NAME}-{VERSION}-{tag}.whl"
    files = []
    for src in sorted(PACKAGE.iterdir()):
        if src.suffix in (".py", ".pyi") or src.name == "py.typed":
            files.append((f"refit/{src.name}", src.read_bytes()))
    files.append((f"refit/{ext.name}", ext.read_bytes()))
    files.append((f"{dist_info}/METADATA", METADATA.encode()))
    files.append((f"{dist_info}/WHEEL", _wheel_text(tag).encode()))
    record = [_record_line(name, data) for name, data in files]
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    path = pathlib.Path(wheel_directory) / wheel_name
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name
