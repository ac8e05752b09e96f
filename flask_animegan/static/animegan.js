/* flask-animegan's upload page, enhanced: drop or paste a photo, preview it, convert it
   without leaving the page, compare before and after, download. The page works without
   this file (a plain form post); nothing here loads anything from another site. */
(function () {
  "use strict";

  function initCompare(root) {
    root.classList.add("animegan-compare-ready");
    if (root.dataset.ready) return;
    root.dataset.ready = "1";
    var range = root.querySelector(".animegan-compare-range");
    var before = root.querySelector(".animegan-compare-before");
    function update() {
      // the left part shows the photo, the right part the anime picture
      before.style.clipPath = "inset(0 " + (100 - Number(range.value)) + "% 0 0)";
    }
    range.addEventListener("input", update);
    update();
  }

  function stemOf(name) {
    var stem = (name || "").replace(/\.[^.]*$/, "").replace(/[^\w.-]+/g, "_");
    return stem || "photo";
  }

  // the same wording as the page without JavaScript (views.sentence)
  function sentence(message) {
    message = String(message).trim();
    if (message && ".!?".indexOf(message.charAt(message.length - 1)) < 0) message += ".";
    return message.charAt(0).toUpperCase() + message.slice(1);
  }

  function statusMessage(response) {
    var wait = response.headers.get("Retry-After");
    var messages = {
      413: "the photo is too big for this server",
      415: "that file is not a photo this server can read",
      429: "too many conversions from your address" + (wait ? "; try again in " + wait + " s" : ""),
      503: "the server is busy" + (wait ? "; try again in " + wait + " s" : "; try again soon")
    };
    return messages[response.status] || "the conversion failed (HTTP " + response.status + ")";
  }

  document.querySelectorAll("[data-animegan-compare]").forEach(function (root) {
    if (!root.closest("[hidden]")) initCompare(root);
  });

  var form = document.getElementById("animegan-form");
  if (!form || !window.fetch || !window.FormData) return;
  document.documentElement.classList.add("animegan-js");
  if (/Mac|iPhone|iPad/.test(navigator.platform || "")) {
    document.querySelectorAll("[data-animegan-paste-key]").forEach(function (key) {
      key.textContent = "\u2318V";
    });
  }

  var input = document.getElementById("animegan-image");
  var drop = document.getElementById("animegan-drop");
  var preview = document.getElementById("animegan-preview");
  var button = document.getElementById("animegan-submit");
  var status = document.getElementById("animegan-status");
  var errorBox = document.getElementById("animegan-error");
  var panel = document.getElementById("animegan-result-panel");
  var faceNote = document.getElementById("animegan-face-note");
  var maxBytes = Number(form.dataset.maxBytes);
  var photo = null;
  var photoUrl = null;
  var resultUrl = null;
  var sentPortrait = "";  // the portrait mode of the conversion last sent

  // The busy indicator's clock. Every end of a conversion stops it *before* writing the
  // status, and a tick checks that its clock still runs, so no late tick can write
  // "Converting... 0.1 s" over the end's status or beside an error.
  var clock = null;

  function startClock() {
    var started = performance.now();
    function elapsed() { return ((performance.now() - started) / 1000).toFixed(1); }
    stopClock("Converting\u2026");
    var id = setInterval(function () {
      if (clock === id) status.textContent = "Converting\u2026 " + elapsed() + " s";
    }, 100);
    clock = id;
    return elapsed;
  }

  function stopClock(text) {
    if (clock !== null) clearInterval(clock);
    clock = null;
    if (text !== undefined) status.textContent = text;
  }

  function showError(message) {
    stopClock("");
    errorBox.textContent = sentence(message);
    errorBox.hidden = false;
    // the box sits above the form: bring it into view and move focus there, so that
    // neither a sighted user scrolled down to the button nor a screen reader misses it
    errorBox.scrollIntoView({ block: "nearest" });
    errorBox.focus({ preventScroll: true });
  }

  function clearError() {
    errorBox.hidden = true;
    errorBox.textContent = "";
  }

  function choose(file) {
    if (!file) return;
    clearError();
    photo = file;
    if (photoUrl) URL.revokeObjectURL(photoUrl);
    photoUrl = URL.createObjectURL(file);
    // shown once the browser could draw it: a file that is not a picture (or one this
    // browser cannot show, such as TIFF) leaves no broken image behind
    preview.hidden = true;
    preview.onload = function () { preview.hidden = false; };
    preview.onerror = function () { preview.hidden = true; preview.removeAttribute("src"); };
    preview.src = photoUrl;
    if (file.size > maxBytes) {
      showError("this photo is " + (file.size / 1048576).toFixed(1) + " MiB; the limit is " +
                form.dataset.maxBytesText);
    }
  }

  function adopt(files) {
    // keep the file input in step, so the form's own validation and a plain post agree
    try { input.files = files; } catch (ignored) { /* old browsers: photo is kept anyway */ }
    choose(files[0]);
  }

  input.addEventListener("change", function () { choose(input.files[0]); });

  ["dragenter", "dragover"].forEach(function (type) {
    drop.addEventListener(type, function (event) {
      event.preventDefault();
      drop.classList.add("animegan-dragging");
    });
  });
  ["dragleave", "drop"].forEach(function (type) {
    drop.addEventListener(type, function () { drop.classList.remove("animegan-dragging"); });
  });
  drop.addEventListener("drop", function (event) {
    event.preventDefault();
    if (event.dataTransfer.files.length) adopt(event.dataTransfer.files);
  });

  document.addEventListener("paste", function (event) {
    var items = (event.clipboardData && event.clipboardData.files) || [];
    if (!items.length) return;
    event.preventDefault();
    var transfer = new DataTransfer();
    var file = items[0];
    transfer.items.add(file.name && file.name !== "image.png" ? file :
      new File([file], "pasted-photo." + (file.type.split("/")[1] || "png"), { type: file.type }));
    adopt(transfer.files);
  });

  function updateFaceNote() {
    var checked = form.querySelector("input[name=style]:checked");
    faceNote.hidden = !(checked && checked.dataset.face === "1");
  }
  if (faceNote) {  // on the page only when a face style is installed
    form.addEventListener("change", updateFaceNote);
    updateFaceNote();
  }

  // What portrait mode and the colour option did (views.describe_options says the same).
  function describeOptions(response) {
    var parts = [];
    var faces = response.headers.get("X-Faces");
    if (faces === "0") {
      parts.push("No face was found" + (response.headers.get("X-AnimeGAN-Face-Crop") === "centre-square" ?
        ": the centre square was converted, as the face styles expect" : "") + ".");
    } else if (faces !== null) {
      parts.push(faces + " face" + (faces === "1" ? "" : "s") + " found and converted on their own.");
    }
    var colors = response.headers.get("X-AnimeGAN-Colors");
    if (colors === "luma") parts.push("The photo's brightness was kept.");
    if (colors === "keep") parts.push("The photo's colours were kept.");
    return parts.join(" ");
  }

  // The photo under the slider as the result shows it: the whole picture, or its centre
  // square (the CSS's object-fit: cover), or with portrait=faces its faces side by side,
  // drawn from the matrices the server sends; on a cache hit, which has none, no slider.
  function showBefore(response, result) {
    var root = panel.querySelector("[data-animegan-compare]");
    var before = root.querySelector(".animegan-compare-before");
    var crops = JSON.parse(response.headers.get("X-AnimeGAN-Face-Crops") || "null");
    var sheet = Number(response.headers.get("X-Faces")) > 0 && sentPortrait === "faces";
    function compare(src) {
      if (src) {
        before.src = src;
        initCompare(root);
      } else {
        root.classList.remove("animegan-compare-ready");  // "The photo you sent" shows instead
      }
    }
    if (!sheet) return compare(photoUrl);
    compare(null);
    if (!crops) return;
    var source = new Image();
    source.src = photoUrl;
    Promise.all([source.decode(), result.decode()]).then(function () {
      var side = result.naturalHeight;
      var width = source.naturalWidth, height = source.naturalHeight;
      var canvas = document.createElement("canvas");
      canvas.width = side * crops.length;
      canvas.height = side;
      var context = canvas.getContext("2d");
      context.fillRect(0, 0, canvas.width, canvas.height);  // black beyond the photo, as there
      crops.forEach(function (m, i) {  // photo (x, y) in fractions -> square (u, v)
        context.save();
        context.beginPath();
        context.rect(i * side, 0, side, side);
        context.clip();
        context.setTransform(m[0] * side / width, m[3] * side / width, m[1] * side / height,
                             m[4] * side / height, m[2] * side + i * side, m[5] * side);
        context.drawImage(source, 0, 0);
        context.restore();
      });
      if (resultUrl === result.src) compare(canvas.toDataURL("image/jpeg", 0.92));
    }, function () { /* a photo this browser cannot draw: no slider */ });
  }

  function showResult(blob, response, elapsed) {
    var style = response.headers.get("X-AnimeGAN-Style") || "anime";
    var ext = { "image/jpeg": "jpg", "image/png": "png", "image/webp": "webp" }[blob.type] || "jpg";
    if (resultUrl) URL.revokeObjectURL(resultUrl);
    resultUrl = URL.createObjectURL(blob);
    var result = panel.querySelector("#animegan-result");
    result.onload = function () {
      panel.querySelector(".animegan-caption").textContent =
        style + ", " + result.naturalWidth + "\u00d7" + result.naturalHeight;
    };
    result.alt = "The photo in the " + style + " style";
    panel.querySelectorAll(".animegan-converted").forEach(function (img) { img.src = resultUrl; });
    panel.querySelector(".animegan-photo-sent .animegan-original").src = photoUrl;
    var note = panel.querySelector("#animegan-result-note");
    note.textContent = describeOptions(response);
    note.hidden = !note.textContent;
    var download = panel.querySelector("#animegan-download");
    download.href = resultUrl;
    download.download = stemOf(photo.name) + "-" + style + "." + ext;
    panel.hidden = false;
    showBefore(response, result);
    // a cache hit takes no time: say why, rather than a bare "Done in 0.0 s."
    stopClock("Done in " + elapsed + " s" + (response.headers.get("X-Cache") === "HIT" ?
      ": this photo was converted here before with these options, so the result came " +
      "from the cache." : "."));
    panel.focus();
  }

  // Animations and videos run as jobs (POST .../jobs, then polled); a still photo is
  // converted at once (POST .../convert). The file's type only picks the first try: the
  // server's 415 names the other endpoint (jobs_url or convert_url) when it was wrong.
  var jobPanel = document.getElementById("animegan-job-panel");
  var jobBar = document.getElementById("animegan-job-bar");
  var jobStatus = document.getElementById("animegan-job-status");
  var jobCancel = document.getElementById("animegan-job-cancel");
  var jobUrl = null;
  var POLL_MS = 1000;

  function movesByType(file) {
    return /^video\//.test(file.type) || file.type === "image/gif" || file.type === "image/apng";
  }

  // a photo that runs in tiles is a job too: its progress is in tiles, not frames
  function describeTiles(job) {
    var tiles = job.tiles_done + " of " + job.tiles_total + " tiles";
    if (job.state === "queued") return "Waiting for a worker\u2026 " + job.tiles_total + " tiles to convert.";
    if (job.state === "running" && !job.tiles_total) return "Reading the photo\u2026";
    if (job.state === "running") {  // the tile being converted
      return "Tile " + Math.min(job.tiles_done + 1, job.tiles_total) + " of " + job.tiles_total +
        (job.eta_s !== null ? ", about " + Math.round(job.eta_s) + " s left" : "") + ".";
    }
    if (job.state === "done") return "Done: " + job.tiles_total + " tiles.";
    return (job.state === "cancelled" ? "Cancelled after " : "Stopped after ") + tiles + ".";
  }

  function describeJob(job) {
    if (job.kind === "photo") return describeTiles(job);
    var frames = job.frames_done + " of " + job.frames_total + " frames";
    if (job.state === "queued" && job.waiting_message) return sentence(job.waiting_message);
    if (job.state === "queued") return "Waiting for a worker\u2026 " + job.frames_total + " frames to convert.";
    if (job.state === "running") {
      return frames + (job.eta_s !== null ? ", about " + Math.round(job.eta_s) + " s left" : "") + ".";
    }
    if (job.state === "done") return "Done: " + frames + ".";
    return (job.state === "cancelled" ? "Cancelled after " : "Stopped after ") + frames + ".";
  }

  function showJob(job) {
    jobPanel.hidden = false;
    var photoJob = job.kind === "photo";
    jobBar.max = Math.max(1, photoJob ? job.tiles_total : job.frames_total);
    jobBar.value = job.state === "done" ? jobBar.max : (photoJob ? job.tiles_done : job.frames_done);
    jobBar.setAttribute("aria-label", photoJob ? "Tiles converted" : "Frames converted");
    document.getElementById("animegan-job-panel-title").textContent =
      photoJob ? "Your large photo" : "Your animation or video";
    jobBar.textContent = Math.round(job.progress * 100) + " %";
    jobStatus.textContent = describeJob(job);
    jobPanel.dataset.state = job.state;
  }

  function showJobResult(job) {
    var image = document.getElementById("animegan-job-image");
    var video = document.getElementById("animegan-job-video");
    var shown = job.kind === "video" ? video : image;
    (job.kind === "video" ? image : video).hidden = true;
    if (job.kind === "video") video.poster = job.preview_url;
    else image.alt = "The " + (job.kind === "photo" ? "photo" : "animation") + " in the " + job.style + " style";
    image.classList.toggle("animegan-job-photo", job.kind === "photo");
    shown.src = job.result_url;
    shown.hidden = false;
    jobPanel.querySelector(".animegan-job-result").hidden = false;
    var download = document.getElementById("animegan-job-download");
    var ext = { "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/png": "png", "video/mp4": "mp4" };
    download.href = job.download_url;
    download.download = stemOf(photo.name) + "-" + job.style + "." + (ext[job.result_mimetype] || "bin");
    download.hidden = false;
    if (job.error) jobStatus.textContent = sentence(job.error);  // a result that ends early says why
    jobCancel.hidden = true;
    jobPanel.focus();
  }

  function resetJob() {
    jobUrl = null;
    jobPanel.hidden = true;
    jobPanel.querySelector(".animegan-job-result").hidden = true;
    document.getElementById("animegan-job-download").hidden = true;
    jobCancel.hidden = false;
  }

  function pollJob(url, finish) {
    jobUrl = url;
    function tick() {
      if (jobUrl !== url) return finish();  // another file was sent since
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          return response.json().then(function (job) {
            if (!response.ok) throw new Error(job.error || statusMessage(response));
            return job;
          });
        })
        .then(function (job) {
          showJob(job);
          if (job.state === "done") { showJobResult(job); finish(); }
          else if (job.state === "failed" || job.state === "cancelled") {
            jobCancel.hidden = true;
            if (job.error) showError(job.error);
            finish();
          } else setTimeout(tick, POLL_MS);
        })
        .catch(function (problem) {
          showError(problem && problem.message ? problem.message :
                    "the server could not be reached; check your connection and try again");
          finish();
        });
    }
    tick();
  }

  jobCancel.addEventListener("click", function () {
    if (!jobUrl) return;
    jobCancel.disabled = true;
    fetch(jobUrl, { method: "DELETE", credentials: "same-origin", headers: { Accept: "application/json" } })
      .catch(function () { /* the next poll says how it ended */ })
      .then(function () { jobCancel.disabled = false; });
  });

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    clearError();
    if (!photo) { showError("choose a photo first"); return; }
    if (photo.size > maxBytes) {
      showError("this photo is too big; the limit is " + form.dataset.maxBytesText);
      return;
    }
    var body = new FormData(form);
    body.set("image", photo, photo.name || "photo");
    sentPortrait = body.get("portrait") || "";
    var elapsed = startClock();
    button.disabled = true;
    form.setAttribute("aria-busy", "true");
    form.classList.add("animegan-busy");
    resetJob();
    panel.hidden = true;

    function finish() {
      stopClock();
      button.disabled = false;
      form.removeAttribute("aria-busy");
      form.classList.remove("animegan-busy");
    }

    function send(url, retried) {
      return fetch(url, { method: "POST", body: body, credentials: "same-origin",
                          headers: { Accept: "application/json" } })
        .then(function (response) {
          if (response.status === 202) {
            stopClock("");
            return response.json().then(function (job) {
              showJob(job);
              pollJob(response.headers.get("Location") || job.url, finish);
            });
          }
          if (response.ok) {
            return response.blob().then(function (blob) {
              showResult(blob, response, elapsed());
              finish();
            });
          }
          return response.json().then(
            function (answer) {
              var other = answer.jobs_url || answer.convert_url;
              if (response.status === 415 && other && !retried) return send(other, true);
              showError(answer.error || statusMessage(response));
              finish();
            },
            function () { showError(statusMessage(response)); finish(); });
        });
    }

    send(movesByType(photo) ? form.dataset.jobsUrl : form.dataset.convertUrl, false)
      .catch(function () {
        showError("the server could not be reached; check your connection and try again");
        finish();
      });
  });
})();
