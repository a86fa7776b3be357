"""The compiled policy core (proxy/core/native/), the common case of a response's caching
rules (proxy/core/_response_rules.c), the proxy's compiled plain hit
(proxy/handler/hitpath/), its parser of plain origin responses (proxy/origin/_origin.c) and
the front connection's read loop (proxy/front/_loop.c);
everything else is in pyproject.toml."""

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


def in_parts(name: str, directory: str) -> Extension:
    """One module from the C files of ``directory``. Link-time optimisation inlines across
    them, so the per-request calls between parts cost what calls within one file do."""
    return Extension(
        name,
        sorted(glob(f"{directory}/*.c")),
        depends=[
            *glob(f"{directory}/*.h"),
            "proxy/core/native/age.h",
            "proxy/core/native/sample.h",
            "proxy/core/native/slots.h",
            "proxy/core/native/clock.h",
        ],
        extra_compile_args=[*FLAGS, "-flto"],
        extra_link_args=["-flto", "-O3"],
    )


setup(
    ext_modules=[
        in_parts("proxy.core._native", "proxy/core/native"),
        Extension(
            "proxy.core._response_rules",
            ["proxy/core/_response_rules.c"],
            extra_compile_args=FLAGS,
        ),
        in_parts("proxy.handler._hits", "proxy/handler/hitpath"),
        Extension("proxy.origin._origin", ["proxy/origin/_origin.c"], extra_compile_args=FLAGS),
        Extension(
            "proxy.front._loop",
            ["proxy/front/_loop.c"],
            depends=["proxy/core/native/slots.h", "proxy/core/native/clock.h"],
            extra_compile_args=FLAGS,
        ),
    ]
)
