"""`toolkit tune`: the verdict drives the search (measure, read the bottleneck, change the knob it names, repeat).

Built on the sweep's state, loop, ranking and promotion (toolkit.core.sweep); see docs/tune.md.
"""
