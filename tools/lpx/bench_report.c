/* Bench result reporting (being written). */
