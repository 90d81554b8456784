"""A report of several runs opens on their comparison: each run's own section (checks, timeline,
ledger, tables: about 4,000 px each) is folded under its heading, one click away. Nine H200 runs
were a 50,000 px page; folded, the comparison fits a few screens (tests/integration/test_views_where_browser.py).

    fold_open(single) -> str    # HTML after a run's heading ("" for a report of one run)
    fold_close(single) -> str   # HTML before the end of its section
    FOLD_SCRIPT                 # opens the fold a link points into; redraws its figures at full width
"""
from __future__ import annotations


def fold_open(single: bool) -> str:
    if single:
        return ""
    return ('<details class="run-fold"><summary>Checks, timeline, ledger and tables of this run '
            '(click to open)</summary>')


def fold_close(single: bool) -> str:
    return "" if single else "</details>"


# Plotly sizes a figure drawn in a closed <details> at its default 700 px: resized when opened.
# A link to a folded run (the run list) or into one opens its fold first.
FOLD_SCRIPT = """<script>(function(){
function resize(d){if(d.open&&window.Plotly){d.querySelectorAll('.js-plotly-plot').forEach(function(g){Plotly.Plots.resize(g);});}}
document.querySelectorAll('details.run-fold').forEach(function(d){d.addEventListener('toggle',function(){resize(d);});});
function foldOf(el){return el&&(el.closest('details.run-fold')||el.querySelector(':scope > details.run-fold'));}
function openTo(id){var el=id&&document.getElementById(id);var d=foldOf(el);
 if(d&&!d.open){d.open=true;}if(el){el.scrollIntoView();}}
window.addEventListener('hashchange',function(){openTo(decodeURIComponent(location.hash.slice(1)));});
document.addEventListener('click',function(e){var a=e.target.closest&&e.target.closest('a[href^="#"]');
 if(a){var d=foldOf(document.getElementById(decodeURIComponent(a.getAttribute('href').slice(1))));
 if(d&&!d.open){d.open=true;}}},true);
if(location.hash){openTo(decodeURIComponent(location.hash.slice(1)));}
})();</script>"""
