"""The compiled policy core (proxy/core/_native.c), the common case of a response's caching
rules (proxy/core/_response_rules.c), the proxy's compiled plain hit (proxy/_hits.c) and
its parser of plain origin responses (proxy/_origin.c); everything else is in
pyproject.toml."""

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
        Extension("proxy.core._native", ["proxy/core/_native.c"], extra_compile_args=FLAGS),
        Extension(
            "proxy.core._response_rules",
            ["proxy/core/_response_rules.c"],
            extra_compile_args=FLAGS,
        ),
        Extension("proxy._hits", ["proxy/_hits.c"], extra_compile_args=FLAGS),
        Extension("proxy._origin", ["proxy/_origin.c"], extra_compile_args=FLAGS),
    ]
)
