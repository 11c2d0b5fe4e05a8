  /* ---------- search across every section ---------- */

  /* The index, search-index.js, is a classic script setting QKV_SEARCH (file:// refuses fetch but
   * loads scripts), loaded on first use. */
  var MAX_RESULTS = 8;

  function setupSearch() {
    var box = document.querySelector("[data-qkv-search]");
    if (!box) return;
    var input = box.querySelector("input");
    var status = box.querySelector("[data-qkv-search-status]");
    var list = box.querySelector("[data-qkv-search-results]");
    var waiting = false;

    function load() {
      if (window.QKV_SEARCH || waiting) return;
      waiting = true;
      var s = el("script", { src: "search-index.js" });
      s.onload = run;
      s.onerror = function () {
        status.textContent = "The search index could not be loaded.";
      };
      document.head.appendChild(s);
    }

    /* The index leaves out words shorter than this (search.rs, MIN_WORD): they match nearly
     * everything. */
    var MIN_WORD = 3;

    /* Every word of the query begins a word of the entry, except a short one ("KV" in "KV
     * cache"), which the index cannot hold: it is required only when the query has nothing
     * longer, and otherwise only ranks, where it must be a whole word ("a" is not "and").
     * Entries come in order of the query's words their title holds, then the short words their
     * opening text holds; ties keep the course's order. */
    function find(query) {
      var data = window.QKV_SEARCH;
      var split = function (t) {
        return t.toLowerCase().split(/[^\p{L}\p{N}]+/u);
      };
      var terms = split(query).filter(Boolean);
      if (!data || !terms.length) return [];
      var short = function (t) {
        return Array.from(t).length < MIN_WORD;
      };
      var hasLongWord = terms.some(function (t) {
        return !short(t);
      });
      var hits = [];
      data.entries.forEach(function (e) {
        var title = " " + split(e[2]).join(" ") + " ";
        var words = " " + e[4];
        var opening = " " + split(e[3]).join(" ") + " ";
        var inTitle = 0;
        var inOpening = 0;
        for (var i = 0; i < terms.length; i++) {
          if (hasLongWord && short(terms[i])) {
            var word = " " + terms[i] + " ";
            if (title.indexOf(word) >= 0) inTitle += 1;
            else if (opening.indexOf(word) >= 0) inOpening += 1;
            continue;
          }
          var t = " " + terms[i];
          if (title.indexOf(t) >= 0) inTitle += 1;
          else if (words.indexOf(t) < 0) return;
        }
        hits.push({ e: e, rank: inTitle, near: inOpening, at: hits.length });
      });
      hits.sort(function (a, b) {
        return b.rank - a.rank || b.near - a.near || a.at - b.at;
      });
      return hits.map(function (h) {
        return h.e;
      });
    }

    function run() {
      var query = input.value.trim();
      list.textContent = "";
      if (!query) {
        status.textContent = "";
        return;
      }
      if (!window.QKV_SEARCH) return load();
      var hits = find(query);
      hits.slice(0, MAX_RESULTS).forEach(function (e) {
        var section = window.QKV_SEARCH.sections[e[0]];
        var a = el("a", { href: section[0] + (e[1] ? "#" + e[1] : "") });
        a.appendChild(el("strong", {}, e[2]));
        a.appendChild(el("span", { class: "search-where" }, " in " + section[1]));
        var li = el("li");
        li.appendChild(a);
        if (e[3]) li.appendChild(el("span", { class: "search-snippet" }, e[3]));
        list.appendChild(li);
      });
      var n = hits.length;
      status.textContent =
        (n === 0 ? "No results" : n === 1 ? "1 result" : n + " results") + " for “" + query + "”" +
        (n > MAX_RESULTS ? ", the first " + MAX_RESULTS + " shown" : "") + ".";
    }

    input.addEventListener("focus", load);
    input.addEventListener("input", run);
    /* Enter opens the first result, Down moves into the list, Escape clears. */
    input.addEventListener("keydown", function (e) {
      var first = list.querySelector("a");
      if (e.key === "Enter" && first) {
        e.preventDefault();
        first.click();
      } else if (e.key === "ArrowDown" && first) {
        e.preventDefault();
        first.focus();
      } else if (e.key === "Escape") {
        input.value = "";
        run();
      }
    });
    list.addEventListener("keydown", function (e) {
      var links = Array.prototype.slice.call(list.querySelectorAll("a"));
      var at = links.indexOf(document.activeElement);
      if (at < 0) return;
      if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        var next = at + (e.key === "ArrowDown" ? 1 : -1);
        (next < 0 ? input : links[Math.min(next, links.length - 1)]).focus();
      } else if (e.key === "Escape") {
        input.focus();
      }
    });
    box.hidden = false;
  }

  FEATURES.push(setupSearch);
