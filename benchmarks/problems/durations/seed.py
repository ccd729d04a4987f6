# EVOLVE-BLOCK-START
def solve(text):
    """Understands plain seconds only: "45" or "45s"."""
    text = text.strip().lower()
    if text.endswith("s"):
        text = text[:-1]
    return float(text)
# EVOLVE-BLOCK-END
