  /* ---------- decode-stepper widgets ---------- */

  /* The build wrote every step as the page shows it (data-qkv-data: per step its title, the
   * cache's rows, the output and what to announce), so stepping only swaps them in: every
   * number shown is the engine's. The buttons stay focusable at either end (aria-disabled), so
   * the focus never drops to the page. */
  function setupDecode(root) {
    var data = json(root, "script[data-qkv-data]");
    var prev = root.querySelector("[data-qkv-prev]");
    var next = root.querySelector("[data-qkv-next]");
    if (!data || !prev || !next) return;
    var at = data.start;
    var last = data.steps.length - 1;
    function show(i) {
      if (i < 0 || i > last) return;
      at = i;
      var step = data.steps[at];
      root.querySelector("[data-qkv-step-title]").innerHTML = step.title;
      root.querySelector("[data-qkv-cache]").innerHTML = step.rows;
      root.querySelector("[data-qkv-output]").innerHTML = step.output;
      root.querySelector("[data-qkv-announce]").textContent = step.announce;
      root.setAttribute("data-qkv-step", step.token);
      state();
    }
    function state() {
      prev.setAttribute("aria-disabled", at === 0 ? "true" : "false");
      next.setAttribute("aria-disabled", at === last ? "true" : "false");
    }
    prev.addEventListener("click", function () {
      show(at - 1);
    });
    next.addEventListener("click", function () {
      show(at + 1);
    });
    prev.parentNode.hidden = false;
    state();
  }

  WIDGETS["decode-stepper"] = setupDecode;
