  /* ---------- progress: per section, across the course, and a reset that asks first ---------- */

  /* Of the checks `ids` of one section, how many stored entries are answered, and their credit. */
  function tally(entries, ids) {
    var t = { answered: 0, score: 0, total: ids.length };
    ids.forEach(function (id) {
      var e = (entries || {})[id];
      if (e && (e.state === "right" || e.state === "revealed")) {
        t.answered += 1;
        t.score += Number(e.credit) || 0;
      }
    });
    return t;
  }

  function counted(t) {
    return t.answered + " of " + t.total + (t.total === 1 ? " check" : " checks") + " answered, score " +
      decimalString(t.score) + " of " + t.total;
  }

  /* Writes a tally onto an indicator: its attributes, its text and its <progress>. */
  function show(node, t, text) {
    node.setAttribute("data-qkv-answered", String(t.answered));
    node.setAttribute("data-qkv-total", String(t.total));
    node.setAttribute("data-qkv-score", decimalString(t.score));
    var line = node.querySelector("[data-qkv-progress-text], [data-qkv-course-text]");
    if (line) line.textContent = text || counted(t);
    var bar = node.querySelector("progress");
    if (bar) {
      bar.max = Math.max(1, t.total);
      bar.value = t.answered;
    }
    node.hidden = false;
  }

  /* Asks before forgetting answers, in a native modal <dialog>: the focus moves to "Cancel",
   * Escape cancels, and the focus goes back to the button that asked. */
  function confirmReset(opener, question, reset) {
    var d = document.querySelector("dialog[data-qkv-confirm]");
    if (!d) {
      d = el("dialog", { "data-qkv-confirm": "", "aria-labelledby": "qkv-confirm-text" });
      d.appendChild(el("p", { id: "qkv-confirm-text" }));
      var row = el("p", { class: "actions" });
      var yes = button("Reset", "data-qkv-confirm-yes");
      var no = button("Cancel", "data-qkv-confirm-no");
      row.appendChild(yes);
      row.appendChild(no);
      d.appendChild(row);
      document.body.appendChild(d);
      yes.addEventListener("click", function () {
        d.close("reset");
      });
      no.addEventListener("click", function () {
        d.close("cancel");
      });
    }
    d.querySelector("#qkv-confirm-text").textContent = question;
    d.returnValue = "";
    d.onclose = function () {
      if (d.returnValue === "reset") reset();
      opener.focus();
    };
    d.showModal();
    d.querySelector("[data-qkv-confirm-no]").focus();
  }

  /* What a check's line in the section summary says. */
  function checkState(q) {
    if (q.state === "right") return q.tries ? "right on try " + (q.tries + 1) + ", " + creditWords(q.earned) : "right, full credit";
    if (q.state === "revealed") return "answer seen, no credit";
    if (q.state === "wrong") return "not answered yet (" + q.tries + (q.tries === 1 ? " wrong try)" : " wrong tries)");
    return "not answered yet";
  }

  function setupProgress() {
    var courseData = json(document, "script[data-qkv-course]") || { sections: [] };
    var roots = document.querySelectorAll("[data-qkv-quiz]");
    var all = loadAll();
    var quizzes = [];

    /* The page's own section, counted from its live quizzes. */
    function live(section) {
      var t = { answered: 0, score: 0, total: 0 };
      quizzes.forEach(function (q) {
        if (!q.graded || q.root.getAttribute("data-qkv-section") !== section) return;
        t.total += 1;
        if (q.state === "right" || q.state === "revealed") {
          t.answered += 1;
          t.score += q.earned;
        }
      });
      return t;
    }

    function update() {
      all = loadAll();
      var course = { answered: 0, score: 0, total: 0 };
      var here = null;
      courseData.sections.forEach(function (s) {
        var onPage = document.querySelector('[data-qkv-quiz][data-qkv-section="' + s.id + '"]');
        var t = onPage ? live(s.id) : tally(all[s.id], s.checks);
        if (onPage) here = t;
        course.answered += t.answered;
        course.score += t.score;
        course.total += t.total;
        var item = document.querySelector('[data-qkv-toc="' + s.id + '"] [data-qkv-toc-progress]');
        if (item && t.total) {
          item.textContent = counted(t);
          item.setAttribute("data-qkv-answered", String(t.answered));
          item.hidden = false;
        }
      });
      document.querySelectorAll("[data-qkv-progress]").forEach(function (p) {
        show(p, live(p.getAttribute("data-qkv-section")));
      });
      document.querySelectorAll("[data-qkv-course-progress], [data-qkv-course-total]").forEach(function (p) {
        var text = "Answered " + (here ? here.answered + "/" + here.total + " here · " : "") +
          course.answered + "/" + course.total + " in all";
        show(p, course, p.hasAttribute("data-qkv-course-total") ? counted(course) : text);
      });
      document.querySelectorAll("[data-qkv-summary]").forEach(function (box) {
        var t = live(box.getAttribute("data-qkv-section"));
        var left = t.total - t.answered;
        box.querySelector("[data-qkv-summary-text]").textContent =
          "You have answered " + t.answered + " of " + t.total + " checks, for a score of " + decimalString(t.score) +
          " of " + t.total + ". " + (left ? left + " left: each is marked below, with a link to it." : "Every check is answered.");
        quizzes.forEach(function (q) {
          var li = box.querySelector('[data-qkv-summary-check="' + q.id + '"]');
          if (!li) return;
          li.querySelector("[data-qkv-summary-state]").textContent = "— " + checkState(q);
          li.setAttribute("data-qkv-state", q.state);
        });
      });
    }

    function store(q) {
      if (!q.graded) return; // practice never counts, and is never kept
      var section = q.root.getAttribute("data-qkv-section");
      all = loadAll();
      all[section] = all[section] || {};
      all[section][q.id] = { state: q.state, credit: q.earned, tries: q.tries, wrong: q.wrong };
      saveAll(all);
    }

    roots.forEach(function (root) {
      var q = new Quiz(root, function (changed) {
        store(changed);
        update();
      });
      var section = root.getAttribute("data-qkv-section");
      if (q.graded && all[section]) q.restore(all[section][q.id]);
      quizzes.push(q);
    });

    /* Every reset button of a section (its indicator's, its summary's) asks first. */
    document.querySelectorAll("[data-qkv-progress] [data-qkv-reset], [data-qkv-summary] [data-qkv-reset]").forEach(function (b) {
      var section = b.closest("[data-qkv-section]").getAttribute("data-qkv-section");
      b.hidden = false;
      b.addEventListener("click", function () {
        confirmReset(b, "Forget every answer you gave in this section? Its checks start over, and this cannot be undone.", function () {
          all = loadAll();
          delete all[section];
          saveAll(all);
          quizzes.forEach(function (q) {
            if (q.root.getAttribute("data-qkv-section") === section) q.reset();
          });
          update();
        });
      });
    });
    document.querySelectorAll("[data-qkv-reset-course]").forEach(function (b) {
      b.addEventListener("click", function () {
        confirmReset(b, "Forget every answer you gave in the whole course? This cannot be undone.", function () {
          var seed = loadAll()["~seed"];
          saveAll(typeof seed === "number" ? { "~seed": seed } : {});
          update();
        });
      });
    });
    update();
  }

  FEATURES.push(setupProgress);
