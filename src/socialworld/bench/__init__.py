"""ASCENT-Bench: the lifelong protocol over arms, method and ablation suites, and the reports."""
