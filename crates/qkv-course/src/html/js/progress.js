  /* ---------- progress: per section, across the course, and a reset that asks first ---------- */

  function done(e) {
    return e && (e.state === "right" || e.state === "revealed");
  }

  function counted(t) {
    return t.answered + " of " + t.total + (t.total === 1 ? " check" : " checks") + " answered, score " +
      decimalString(t.score) + " of " + t.total;
  }

  /* A tally onto an indicator: its attributes, its text and its <progress>. */
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

  /* A native modal <dialog>: the focus starts on Cancel, Escape cancels, and it goes back to the
   * button that asked. */
  function confirmReset(opener, question, reset) {
    var d = document.querySelector("dialog[data-qkv-confirm]");
    if (!d) {
      d = el("dialog", { "data-qkv-confirm": "", "aria-labelledby": "qkv-confirm-text" });
      d.appendChild(el("p", { id: "qkv-confirm-text" }));
      var row = d.appendChild(el("p", { class: "actions" }));
      ["Reset", "Cancel"].forEach(function (label, i) {
        var b = row.appendChild(button(label, i ? "data-qkv-confirm-no" : "data-qkv-confirm-yes"));
        b.addEventListener("click", function () {
          d.close(i ? "" : "reset");
        });
      });
      document.body.appendChild(d);
    }
    d.firstChild.textContent = question + " This cannot be undone.";
    d.returnValue = "";
    d.onclose = function () {
      if (d.returnValue === "reset") reset();
      opener.focus();
    };
    d.showModal();
    d.querySelector("[data-qkv-confirm-no]").focus();
  }

  /* A check's line in the section summary. */
  function checkState(q) {
    if (q.state === "right") return q.tries ? "right on try " + (q.tries + 1) + ", " + creditWords(q.earned) : "right, full credit";
    if (q.state === "revealed") return "answer seen, no credit";
    return "not answered yet" + (q.tries ? " (" + q.tries + " wrong)" : "");
  }

  function setupProgress() {
    var course = (json(document, "script[data-qkv-course]") || { sections: [] }).sections;
    var all = loadAll();
    var quizzes = [];
    var $ = function (s) {
      return document.querySelectorAll(s);
    };

    /* A section's tally: from its quizzes when they are on the page, else from storage. */
    function tally(id, ids) {
      var t = { answered: 0, score: 0, total: 0 };
      var here = quizzes.filter(function (q) {
        return q.graded && q.root.getAttribute("data-qkv-section") === id;
      });
      var entries = here.length ? here.map(function (q) {
        return { state: q.state, credit: q.earned };
      }) : (ids || []).map(function (q) {
        return (all[id] || {})[q];
      });
      entries.forEach(function (e) {
        t.total += 1;
        if (done(e)) {
          t.answered += 1;
          t.score += Number(e.credit) || 0;
        }
      });
      t.here = here.length > 0;
      return t;
    }

    function update() {
      all = loadAll();
      var sum = { answered: 0, score: 0, total: 0 };
      var here = null;
      course.forEach(function (s) {
        var t = tally(s.id, s.checks);
        if (t.here) here = t;
        sum.answered += t.answered;
        sum.score += t.score;
        sum.total += t.total;
        var item = document.querySelector('[data-qkv-toc="' + s.id + '"] [data-qkv-toc-progress]');
        if (item && t.total) {
          item.textContent = counted(t);
          item.setAttribute("data-qkv-answered", String(t.answered));
        }
      });
      $("[data-qkv-progress]").forEach(function (p) {
        show(p, tally(p.getAttribute("data-qkv-section")));
      });
      $("[data-qkv-course-total]").forEach(function (p) {
        show(p, sum);
      });
      $("[data-qkv-course-progress]").forEach(function (p) {
        show(p, sum, "Answered " + (here ? here.answered + "/" + here.total + " here · " : "") + sum.answered + "/" + sum.total + " in all");
      });
      $("[data-qkv-summary]").forEach(function (box) {
        var t = tally(box.getAttribute("data-qkv-section"));
        var left = t.total - t.answered;
        box.querySelector("[data-qkv-summary-text]").textContent = "You have answered " + counted(t).replace(" answered", "") +
          ". " + (left ? left + " left: each is marked below, with a link to it." : "Every check is answered.");
        quizzes.forEach(function (q) {
          var li = box.querySelector('[data-qkv-summary-check="' + q.id + '"]');
          if (!li) return;
          li.lastChild.textContent = "— " + checkState(q);
          li.setAttribute("data-qkv-state", q.state);
        });
      });
    }

    $("[data-qkv-quiz]").forEach(function (root) {
      var section = root.getAttribute("data-qkv-section");
      var q = new Quiz(root, function (c) {
        if (!c.graded) return update(); // practice never counts, and is never kept
        all = loadAll();
        all[section] = all[section] || {};
        all[section][c.id] = { state: c.state, credit: c.earned, tries: c.tries, wrong: c.wrong };
        saveAll(all);
        update();
      });
      if (q.graded && all[section]) q.restore(all[section][q.id]);
      quizzes.push(q);
    });

    /* Every reset asks first: a section's (its indicator's, its summary's), or the course's. */
    $("[data-qkv-reset]:not([data-qkv-widget] *), [data-qkv-reset-course]").forEach(function (b) {
      var box = b.closest("[data-qkv-section]");
      var section = box && box.getAttribute("data-qkv-section");
      b.hidden = false;
      b.addEventListener("click", function () {
        confirmReset(b, section ? "Forget every answer you gave in this section?" : "Forget every answer you gave in the course?", function () {
          var seed = loadAll()["~seed"];
          if (section) {
            all = loadAll();
            delete all[section];
          } else {
            all = typeof seed === "number" ? { "~seed": seed } : {};
          }
          saveAll(all);
          quizzes.forEach(function (q) {
            if (!section || q.root.getAttribute("data-qkv-section") === section) q.reset();
          });
          update();
        });
      });
    });
    update();
  }

  FEATURES.push(setupProgress);
