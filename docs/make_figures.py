"""Regenerate the figures the README and the API reference show.

    python docs/make_figures.py            # writes docs/*.png
    python docs/make_figures.py --screenshots   # also the induction report's screenshots (needs
                                                # torch, chromium, chromedriver and selenium)

Every figure comes from the library itself, with a fixed seed, so the PNGs in the
repository are reproducible.
"""
import os

import numpy as np

import attngeom as ag

HERE = os.path.dirname(os.path.abspath(__file__))


def laplace_radon_identity(path):
    """Left: softmax attention against the Laplace-Radon transform N / Z (the same numbers by
    two code paths). Right: one query's weights over its keys, ordered by the projected
    coordinate s = u.k, for the exponential kernel (softmax) and two swapped kernels."""
    plt = ag.plotting.pyplot()
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((64, 16)), rng.standard_normal((96, 16)), rng.standard_normal((96, 8))
    y = ag.softmax_attention(q, k, v)
    u, tau = ag.tilt_radius(q)
    y_lr = ag.laplace_radon_attention(u, tau, k, v)
    rel = float(np.abs(y_lr - y).max() / np.abs(y).max())

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.8))
    ag.plotting.identity_scatter(y, y_lr, rel, "softmax attention  y = softmax(q k^T / sqrt(d)) v",
                                 "Laplace-Radon  y = N(u, tau) / Z(u, tau)", ax=ax0)
    ax0.set_title(f"the identity (Laplace-Radon Thm 1): max rel. error {rel:.1e}", fontsize="medium")

    s = ag.radon_project(u[:1], k)[0]
    order = np.argsort(s)
    for kernel, params, style in [("exp", {}, "-"), ("gaussian", {"sigma": 0.5}, "--"), ("cauchy", {"gamma": 0.5}, ":")]:
        _, P = ag.laplace_radon_attention(u[:1], tau[:1], k, v, kernel=kernel, return_routing=True, **params)
        label = kernel if not params else f"{kernel} ({', '.join(f'{a}={b}' for a, b in params.items())})"
        ax1.plot(s[order], P[0, order], style, lw=1.5, label=label)
    ax1.set_xlabel("projected coordinate s = u . k of each key (query 0)")
    ax1.set_ylabel("attention weight of the key")
    ax1.set_title(f"one query (radius tau = {tau[0]:.2f}): kernels on s", fontsize="medium")
    ax1.legend(frameon=False, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _chromium(width, height):
    """Headless Chromium driven by Selenium (the system's browser and driver, nothing downloaded)."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-headless-shell")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},{height}"):
        options.add_argument(a)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def induction_screenshots(report_png, view_png):
    """The README's induction recipe (attngeom run induction, then attngeom heads on its last
    checkpoint), and screenshots of report.html's first screen and of its head view with the
    induction head chosen and a repeated token pinned."""
    import glob
    import tempfile

    from attngeom.cli import main

    work = tempfile.mkdtemp()
    os.chdir(work)
    main(["run", "induction", "--set", "layers=2", "--set", "iterations=1200", "--set", "seeds=1", "--out", "runs"])
    (run,) = glob.glob("runs/induction_*")
    with open("notes.txt", "w") as f:
        f.write("The code is qZ7!kd9Xw&pL. Again, the code is qZ7!kd9Xw&pL.\n\nTo be or not to be. To be or not "
                "to be.\n")
    main(["heads", os.path.join(run, "checkpoints", "2layer", "seed0", "step001200"), "--text", "notes.txt",
          "--effects"])
    head = ag.models.induction_scores(ag.load_model(os.path.join(run, "checkpoints", "2layer", "seed0",
                                                                   "step001200"))).top(1)[0]
    driver = _chromium(1280, 760)
    try:
        driver.get("file://" + os.path.abspath("heads_report/report.html"))
        query = "The code is qZ7!kd9Xw&pL. Again, the code is qZ7!kd9Xw&pL.".rindex("X")  # the second X: reads w
        driver.execute_script(f"document.getElementById('head-view').attngeomSelect({head[0]}, {head[1]}, {query})")
        driver.save_screenshot(report_png)
        view = driver.find_element("css selector", "#head-view")
        driver.execute_script("arguments[0].scrollIntoView()", view)
        view.screenshot(view_png)
    finally:
        driver.quit()


if __name__ == "__main__":
    import sys

    import matplotlib

    matplotlib.use("Agg")
    laplace_radon_identity(os.path.join(HERE, "tomography_identity.png"))
    print("wrote", os.path.join(HERE, "tomography_identity.png"))
    if "--screenshots" in sys.argv:
        paths = [os.path.join(HERE, "induction_report.png"), os.path.join(HERE, "head_view.png")]
        induction_screenshots(*paths)
        print("wrote", *paths)
