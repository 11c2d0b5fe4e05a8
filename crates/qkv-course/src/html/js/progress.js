  /* ---------- progress, per section ---------- */

  function setupQuizzes() {
    var roots = document.querySelectorAll("[data-qkv-quiz]");
    if (!roots.length) return;
    var all = loadAll();
    var quizzes = [];
    var indicators = document.querySelectorAll("[data-qkv-progress]");

    function update() {
      indicators.forEach(function (p) {
        var section = p.getAttribute("data-qkv-section");
        var answered = 0;
        var score = 0;
        var total = 0;
        quizzes.forEach(function (q) {
          if (!q.graded || q.root.getAttribute("data-qkv-section") !== section) return;
          total += 1;
          if (q.state === "right" || q.state === "revealed") {
            answered += 1;
            score += q.earned;
          }
        });
        p.setAttribute("data-qkv-answered", String(answered));
        p.setAttribute("data-qkv-total", String(total));
        p.setAttribute("data-qkv-score", decimalString(score));
        var text = p.querySelector("[data-qkv-progress-text]");
        if (text) {
          text.textContent =
            answered + " of " + total + (total === 1 ? " check" : " checks") + " answered, score " +
            decimalString(score) + " of " + total;
        }
        var bar = p.querySelector("progress");
        if (bar) {
          bar.max = total;
          bar.value = answered;
        }
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

    indicators.forEach(function (p) {
      var section = p.getAttribute("data-qkv-section");
      var reset = p.querySelector("[data-qkv-reset]");
      if (reset) {
        reset.addEventListener("click", function () {
          all = loadAll();
          delete all[section];
          saveAll(all);
          quizzes.forEach(function (q) {
            if (q.root.getAttribute("data-qkv-section") === section) q.reset();
          });
          update();
        });
      }
      p.hidden = false;
    });
    update();
  }

  FEATURES.push(setupQuizzes);
