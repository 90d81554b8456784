"""A report of several runs opens on their comparison: each run's own section (checks, timeline,
ledger, tables: about 4,000 px each) is folded under its heading, one click away. Nine H200 runs
were a 50,000 px page; folded, the comparison fits a few screens (tests/integration/test_views_where_browser.py).

    fold_open(single) -> str    # HTML after a run's heading ("" for a report of one run)
    fold_close(single) -> str   # HTML before the end of its section
    DEFER_SCRIPT                # after plotly.js, before the figures: a closed fold's figures wait for it to open
    FOLD_SCRIPT                 # opens the fold a link points into, drawing its figures first

A closed fold's figures are drawn when it opens, at the width they will have: the nine H200 runs' report drew
29 figures to show one: 5.1-5.4 s and 7.6-8.0 machine CPU-s a page load in Chromium, 1.6 s and 2.7 with
the folded ones waiting (docs/benchmarks.md, "A comparison draws its folded runs when opened").
"""
from __future__ import annotations


def fold_open(single: bool) -> str:
    if single:
        return ""
    return ('<details class="run-fold"><summary>Checks, timeline, ledger and tables of this run '
            '(click to open)</summary>')


def fold_close(single: bool) -> str:
    return "" if single else "</details>"


# Plotly.newPlot of a figure inside a closed fold is kept, not run: `mpOpenFold` (a link into the fold) or the
# fold's own toggle (a click on its summary) runs it. A fold opened again after a window resize redraws what it
# drew before at its new width (Plotly sizes a hidden figure at its 700 px default).
DEFER_SCRIPT = """<script>(function(){
var draw=Plotly.newPlot;
Plotly.newPlot=function(gd){var el=typeof gd==='string'?document.getElementById(gd):gd;
 var d=el&&el.closest('details.run-fold');var args=arguments;
 if(d&&!d.open){(d.mpWaiting=d.mpWaiting||[]).push(function(){return draw.apply(Plotly,args);});return Promise.resolve(el);}
 return draw.apply(Plotly,args);};
window.mpDrawFold=function(d){var w=d.mpWaiting;d.mpWaiting=null;if(w){w.forEach(function(f){f();});d.mpFresh=true;}};
window.mpOpenFold=function(d){if(!d.open){d.open=true;}window.mpDrawFold(d);};
})();</script>"""

FOLD_SCRIPT = """<script>(function(){
function resize(d){if(window.Plotly){d.querySelectorAll('.js-plotly-plot').forEach(function(g){Plotly.Plots.resize(g);});}}
document.querySelectorAll('details.run-fold').forEach(function(d){d.addEventListener('toggle',function(){
 if(!d.open){return;}if(d.mpWaiting){mpDrawFold(d);}if(d.mpFresh){d.mpFresh=false;}else{resize(d);}});});
function foldOf(el){return el&&(el.closest('details.run-fold')||el.querySelector(':scope > details.run-fold'));}
function openTo(id){var el=id&&document.getElementById(id);var d=foldOf(el);
 if(d){mpOpenFold(d);}if(el){el.scrollIntoView();}}
window.addEventListener('hashchange',function(){openTo(decodeURIComponent(location.hash.slice(1)));});
document.addEventListener('click',function(e){var a=e.target.closest&&e.target.closest('a[href^="#"]');
 if(a){var d=foldOf(document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1))));
 if(d){mpOpenFold(d);}}},true);
if(location.hash){openTo(decodeURIComponent(location.hash.slice(1)));}
})();</script>"""
