"""What the analysis scripts share: a server's audit trace split into its bursts of steps."""


def bursts(steps, gap_s=1.0):
    """``steps`` (audit ``TraceStep``s in launch order) split wherever the launches pause over ``gap_s``
    seconds: one burst per round of requests."""
    out, cur = [], []
    for s in steps:
        if cur and s.t_launch - cur[-1].t_launch > gap_s:
            out.append(cur)
            cur = []
        cur.append(s)
    return out + [cur]
