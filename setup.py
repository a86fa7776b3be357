"""The compiled policy core (proxy/core/native/), the common case of a response's caching
rules (proxy/core/_response_rules.c), the proxy's compiled plain hit (proxy/hitpath/) and
its parser of plain origin responses (proxy/_origin.c); everything else is in
pyproject.toml."""

from glob import glob

from setuptools import Extension, setup

FLAGS = [
    "-O3",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-Wno-cast-function-type",
]

setup(
    ext_modules=[
        # One module from the core's parts; link-time optimisation inlines across them, so the
        # per-request calls between parts cost what calls within one file do.
        Extension(
            "proxy.core._native",
            sorted(glob("proxy/core/native/*.c")),
            depends=glob("proxy/core/native/*.h"),
            extra_compile_args=[*FLAGS, "-flto"],
            extra_link_args=["-flto", "-O3"],
        ),
        Extension(
            "proxy.core._response_rules",
            ["proxy/core/_response_rules.c"],
            extra_compile_args=FLAGS,
        ),
        Extension(
            "proxy._hits",
            sorted(glob("proxy/hitpath/*.c")),
            depends=glob("proxy/hitpath/*.h"),
            extra_compile_args=[*FLAGS, "-flto"],
            extra_link_args=["-flto", "-O3"],
        ),
        Extension("proxy._origin", ["proxy/_origin.c"], extra_compile_args=FLAGS),
    ]
)
