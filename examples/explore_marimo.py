"""Explore a KV cache in marimo: ``marimo edit examples/explore_marimo.py`` (or ``python examples/explore_marimo.py``
to run it as a script). The widget is kvviz's anywidget, wrapped as a marimo UI element."""

import marimo

app = marimo.App()


@app.cell
def _():
    import marimo as mo

    import kvviz
    from kvviz import Edit, Session, load_model, what_if
    from kvviz.notebook import html

    lm = load_model()
    session = Session(lm)
    session.add_user_turn("My name is Ada and I live in Lisbon. Where do I live?")
    session.generate(12)
    return Edit, html, kvviz, mo, session, what_if


@app.cell
def _(html, session):
    html(session)  # the strip as static HTML (marimo shows any object with _repr_html_)
    return


@app.cell
def _(kvviz, mo, session):
    strip = mo.ui.anywidget(kvviz.widget(session))
    strip
    return (strip,)


@app.cell
def _(mo, session, strip, what_if):
    strip.value  # this cell reads the widget: marimo runs it again after every click in it
    w = strip.widget
    mo.md("Click a chip above to evict it." if w.result is None else
          f"evicted {sorted(w.edit.evicted_slots())} · KL in the widget {w.kl!r} · "
          f"`what_if` of the same edit {what_if(session, w.edit).next_token.kl!r}")
    return


@app.cell
def _(Edit, mo, session, strip, what_if):
    if mo.app_meta().mode == "script":  # python explore_marimo.py: nobody clicks, so what a click on chip 12 does
        strip.widget.evict(12)
        assert strip.widget.result.next_token.kl == what_if(session, Edit.evict([12])).next_token.kl
        print("evicted [12] · KL", strip.widget.kl)
    return


if __name__ == "__main__":
    app.run()
