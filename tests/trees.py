"""What the fuzz tests share: every position in a nested tree of maps and lists."""


def positions(tree, prefix: tuple = ()) -> list[tuple]:
    """Every position in `tree` (maps by key, lists by index), the root `()` first."""
    out = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += positions(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += positions(value, (*prefix, i))
    return out
