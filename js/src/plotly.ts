// plotly.js as the exported page needs it: the core (which holds the scatter trace of the
// prefetch graph) and the icicle and treemap traces of the explorer, nothing else. The
// whole plotly.js bundle is 4.8 MB and takes seconds to start on a slow machine; this one
// is a quarter of that and starts ten times sooner. fsdpviz.export checks that every trace
// of the page's figures is one of PAGE_TRACES (fsdpviz/export/_html.py).

import Plotly from "plotly.js/lib/core";
import icicle from "plotly.js/lib/icicle";
import treemap from "plotly.js/lib/treemap";

Plotly.register([icicle, treemap]);
(globalThis as { Plotly?: unknown }).Plotly = Plotly;
