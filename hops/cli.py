"""The ``hops`` command."""

from __future__ import annotations

import typer

app = typer.Typer(help="Hops: heterogeneity-aware, latency-ratio-fair DL cluster scheduling.")


@app.command()
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as _v

    typer.echo(_v("hops-scheduler"))


if __name__ == "__main__":  # pragma: no cover
    app()
