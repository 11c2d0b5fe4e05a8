  /* ---------- the lab ---------- */

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    return new Promise(function (resolve, reject) {
      var area = el("textarea", { readonly: "", class: "offscreen" });
      area.value = text;
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try {
        ok = document.execCommand("copy");
      } catch (e) {
        ok = false;
      }
      document.body.removeChild(area);
      if (ok) resolve();
      else reject(new Error("copy refused"));
    });
  }

  function setupCopyButtons() {
    document.querySelectorAll("pre > code").forEach(function (code) {
      var pre = code.parentNode;
      var b = el("button", { type: "button", class: "copy", "data-qkv-copy": "" }, "Copy");
      b.addEventListener("click", function () {
        copyText(code.textContent).then(
          function () {
            b.textContent = "Copied";
          },
          function () {
            b.textContent = "Select and copy";
          }
        );
        setTimeout(function () {
          b.textContent = "Copy";
        }, 1600);
      });
      pre.classList.add("has-copy");
      pre.insertBefore(b, code);
    });
  }

  /* From file:// a browser shows a linked local file instead of saving it, download attribute
   * or not; the page carries the notebook's text, so hand that over as a file. */
  function setupNotebookLinks() {
    if (window.location.protocol !== "file:") return;
    document.querySelectorAll("a[data-qkv-notebook]").forEach(function (link) {
      var holder = link.closest("p");
      var next = holder && holder.nextElementSibling;
      if (!next || !next.hasAttribute("data-qkv-notebook-text")) return;
      link.addEventListener("click", function (e) {
        var nb;
        try {
          nb = JSON.parse(next.textContent);
        } catch (err) {
          return;
        }
        e.preventDefault();
        var url = URL.createObjectURL(new Blob([nb.text], { type: "application/x-ipynb+json" }));
        var a = el("a", { href: url, download: nb.name });
        document.body.appendChild(a);
        a.click();
        document.body.removeChild(a);
        setTimeout(function () {
          URL.revokeObjectURL(url);
        }, 5000);
      });
    });
  }

  FEATURES.push(setupCopyButtons, setupNotebookLinks);
